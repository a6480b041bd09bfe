"""Checkpoints, RNG state and HF export for miles (no Prefect, no MLflow here).

On disk (details in layout.py, export.py and docs/checkpoints.md):

    <save_dir>/latest                     rollout id of the last saved checkpoint, rewritten atomically last
    <save_dir>/<rollout_id>/              model/, optimizer.pt, rng.pt, extra/, meta.json, .complete
    <export_dir>/<rollout_id>/            HF safetensors shards + index + config + tokenizer, .complete last

Guarantees: a checkpoint is written under `.tmp-<id>-<pid>`, its `.complete` manifest written last,
then renamed into place; only then does `latest` move and retention delete old ones. A failed save
leaves earlier checkpoints and `latest` untouched. Readers skip (and log, naming the dir) anything
incomplete: temp dirs, dirs without a valid marker, missing or truncated files.
"""

from miles_core.checkpoint._fs import DiskFull
from miles_core.checkpoint.errors import CheckpointError
from miles_core.checkpoint.export import export_hf, is_complete_export, list_exports
from miles_core.checkpoint.layout import CheckpointInfo
from miles_core.checkpoint.load import find_latest, list_checkpoints, load_checkpoint
from miles_core.checkpoint.rng import capture_rng_state, restore_rng_state
from miles_core.checkpoint.save import save_checkpoint
from miles_core.checkpoint.validate import validate_hf_dir

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "DiskFull",
    "capture_rng_state",
    "export_hf",
    "find_latest",
    "is_complete_export",
    "list_checkpoints",
    "list_exports",
    "load_checkpoint",
    "restore_rng_state",
    "save_checkpoint",
    "validate_hf_dir",
]

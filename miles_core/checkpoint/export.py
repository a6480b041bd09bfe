"""HF export: a Hugging Face model directory per rollout, `.complete` written last.

    <export_dir>/<rollout_id>/
      model-00001-of-0000N.safetensors ...   shards of at most `max_shard_size` bytes of tensor data
                                             (a single tensor bigger than that gets its own shard);
                                             always this naming and always an index, even for N=1
      model.safetensors.index.json           {"metadata": {"total_size": bytes of tensor data},
                                              "weight_map": {tensor name: shard file}}
      config.json                            model.config with dtype and architectures set
      generation_config.json                 when the model can generate
      tokenizer files                        whatever tokenizer.save_pretrained writes
      .complete                              JSON manifest of every file and its size; written last
    <export_dir>/.tmp-<rollout_id>-<pid>/    an export in progress; skipped and reported

The state dict is prepared the way `PreTrainedModel.save_pretrained` prepares it: tied weights
stored once under the name the model expects on reload (`lm_head.weight` dropped when tied, so
`from_pretrained` ties it back), and any load-time weight conversion reverted, so the files load with
`AutoModelForCausalLM.from_pretrained(dir)` (same dtype as the source: `config.dtype` is set).

Re-exporting an id first deletes the old snapshot's `.complete` (readers stop trusting it at once),
writes the new snapshot in the temp dir, writes its `.complete`, and swaps it in. A failure at any
point removes the temp dir and leaves no `.complete` for that id.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

from miles_core.checkpoint._fs import (
    MARKER,
    TMP_PREFIX,
    fsync_path,
    marker_problem,
    naming_full_disk,
    remove_tree,
    replace_dir,
    write_bytes_durable,
    write_marker,
)
from miles_core.checkpoint._tensors import split_aliases
from miles_core.checkpoint.errors import CheckpointError
from miles_core.checkpoint.layout import check_rollout_id, scan_numbered_dirs
from miles_core.finite import check_weights

logger = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"


def export_hf(model, tokenizer, export_dir: Path, rollout_id: int, *, max_shard_size: int = 2**30,
              dtype: torch.dtype | None = None, extra: Callable[[Path], None] | None = None) -> Path:
    """Write `model` + `tokenizer` as an HF directory `<export_dir>/<rollout_id>/`; return it. ``dtype``: the
    floating tensors and config.dtype in that dtype (a mixed-precision trainer's model dtype; default the model's).
    ``extra(dir)`` writes more files into the snapshot before `.complete` (LoRA: the PEFT adapter in adapter/)."""
    check_rollout_id(rollout_id)
    if max_shard_size <= 0:
        raise CheckpointError(f"max_shard_size must be > 0 bytes, got {max_shard_size!r}")
    export_dir = Path(export_dir)
    final = export_dir / str(rollout_id)
    check_weights(model.state_dict().items(), f"export of rollout {rollout_id} to {export_dir}")  # never a non-finite model
    export_dir.mkdir(parents=True, exist_ok=True)
    if (final / MARKER).exists():
        (final / MARKER).unlink()
        fsync_path(final)
    tmp = export_dir / f"{TMP_PREFIX}{rollout_id}-{os.getpid()}"
    for stale in export_dir.glob(f"{TMP_PREFIX}{rollout_id}-*"):  # left by a killed earlier export of this id
        logger.warning("removing %s, an interrupted export of rollout %d", stale, rollout_id)
        remove_tree(stale)
    try:
        tmp.mkdir()
        with naming_full_disk(final, _export_bytes(model, dtype)):
            _write_weights(model, tmp, max_shard_size, dtype)
            _write_config(model, tmp, dtype)
            tokenizer.save_pretrained(tmp)
            if extra is not None:
                extra(tmp)
            write_marker(tmp, {"rollout_id": rollout_id})
        replace_dir(tmp, final)
    except BaseException:
        remove_tree(tmp)
        raise
    return final


def _export_bytes(model, dtype: torch.dtype | None) -> int:
    """The weights' bytes in the export (floating tensors in ``dtype`` when given)."""
    size = torch.empty(0, dtype=dtype).element_size() if dtype is not None else None
    return sum(t.numel() * (size if size and t.is_floating_point() else t.element_size()) for t in model.state_dict().values())


def is_complete_export(path: Path) -> bool:
    """True when `path/.complete` exists and its manifest matches the files."""
    path = Path(path)
    return path.is_dir() and marker_problem(path) is None


def list_exports(export_dir: Path) -> list[tuple[int, Path]]:
    """Complete snapshots `(rollout_id, dir)`, ascending; incomplete ones are reported and skipped."""
    return scan_numbered_dirs(Path(export_dir), marker_problem, "HF export")


def hf_state_dict(model) -> dict[str, torch.Tensor]:
    """The state dict as `save_pretrained` would store it: tied weights once, conversions reverted."""
    state_dict = model.state_dict()
    try:
        from transformers.core_model_loading import revert_weight_conversion
        from transformers.modeling_utils import remove_tied_weights_from_state_dict
    except ImportError:  # transformers moved these internals: fall back to plain alias removal
        return split_aliases(state_dict)[0]
    state_dict = remove_tied_weights_from_state_dict(state_dict, model)
    return revert_weight_conversion(model, state_dict)


def plan_shards(sizes: dict[str, int], max_shard_size: int) -> list[list[str]]:
    """Greedy, order-preserving split of tensor names into shards of <= max_shard_size bytes."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes.items():
        if shards[-1] and used + size > max_shard_size:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def _write_weights(model, out: Path, max_shard_size: int, dtype: torch.dtype | None = None) -> None:
    state_dict = hf_state_dict(model)
    if dtype is not None:
        state_dict = {name: t.to(dtype) if t.is_floating_point() else t for name, t in state_dict.items()}
    sizes = {name: t.numel() * t.element_size() for name, t in state_dict.items()}
    shards = plan_shards(sizes, max_shard_size)
    weight_map = {}
    for i, names in enumerate(shards, start=1):
        filename = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        tensors = {name: state_dict[name].detach().cpu().contiguous() for name in names}
        save_file(tensors, out / filename, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, filename))
    index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": dict(sorted(weight_map.items()))}
    write_bytes_durable(out / INDEX_FILE, json.dumps(index, indent=2).encode())


def _write_config(model, out: Path, dtype: torch.dtype | None = None) -> None:
    config = copy.deepcopy(model.config)
    dtype = dtype or getattr(model, "dtype", None)
    if isinstance(dtype, torch.dtype):
        config.dtype = str(dtype).removeprefix("torch.")
    config.architectures = [type(model).__name__]
    config.save_pretrained(out)
    can_generate = getattr(model, "can_generate", None)
    generation_config = getattr(model, "generation_config", None)
    if callable(can_generate) and can_generate() and generation_config is not None:
        generation_config.save_pretrained(out)

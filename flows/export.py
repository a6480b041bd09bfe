"""The export flow: a saved checkpoint (a dir, or `latest` of a save dir) -> an HF snapshot,
logged to its training run in MLflow and registered. Cached across runs on the checkpoint."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from miles_core.checkpoint import find_latest
from miles_core.checkpoint.layout import read_info
from miles_core.evaluation.discover import checkpoint_point
from tasks.export import export_checkpoint, register


@flow(name="export")
def export(checkpoint: str, export_dir: str, tracking_uri: str | None = None, registered_model_name: str | None = None,
           champion_metric: str | None = None) -> dict:
    path = Path(checkpoint)
    info = read_info(path) if (path / "meta.json").exists() else find_latest(path)
    if info is None:
        raise FileNotFoundError(f"no complete checkpoint at {checkpoint} (a checkpoint dir or a save dir with one)")
    meta = info.meta
    out = export_checkpoint(str(info.path), str(meta.get("created_at")), meta["tokenizer_dir"], export_dir, info.rollout_id)
    result = {"export_path": out, "rollout_id": info.rollout_id}
    if tracking_uri and meta.get("mlflow_run_id"):
        step = meta.get("steps_done", 0)
        eval_step = checkpoint_point(info.path).step  # the eval/step these weights were synced and evaluated as
        result |= register(tracking_uri, meta["mlflow_run_id"], out, info.rollout_id, step, registered_model_name, champion_metric,
                           eval_step)
    return result

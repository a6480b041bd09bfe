"""What the eval flow evaluates, found on disk: a checkpoint dir, a save dir (its latest checkpoint,
or all), an HF export dir (its newest snapshot, or all), or one snapshot dir; and the training run
the points belong to (MLflow run id and tracking URI).

Steps (eval/step = the weight version the weights were synced as, docs/decisions.md):
  checkpoint of rollout i, meta weight_version v   -> v + 1
  HF export of rollout i                           -> the checkpoint of rollout i's step when it is on
                                                      disk, else i + 2 (one sync before rollout 0, one
                                                      after each rollout)
A numbered dir that is not complete is still a point: evaluating it records ckpt_missing.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from miles_core.checkpoint import find_latest, list_exports
from miles_core.checkpoint.layout import META_FILE, parse_rollout_id

from .point import EvalPoint

RUN_MARKER = "mlflow_run.json"  # written into the run dir by the train flow: {run_id, tracking_uri}


@dataclass(frozen=True)
class RunRef:
    """The training run points belong to; ``run_id`` None when nothing on disk names one."""

    run_id: str | None
    tracking_uri: str
    run_dir: Path | None
    meta: dict  # the meta.json of a checkpoint of the run (recipe, tokenizer_dir, ...), {} if none


def _meta(path: Path) -> dict | None:
    try:
        return json.loads((path / META_FILE).read_text())
    except (OSError, ValueError):
        return None


def checkpoint_point(path: Path) -> EvalPoint:
    rollout_id = parse_rollout_id(path.name)
    meta = _meta(path) or {}
    if "weight_version" in meta:
        step = meta["weight_version"] + 1
    elif rollout_id is not None:
        step = rollout_id + 2
    else:
        raise FileNotFoundError(f"{path}: not a checkpoint dir (no readable {META_FILE}, name is not a rollout id)")
    return EvalPoint(step, path, "checkpoint", meta.get("rollout_id", rollout_id))


def snapshot_point(path: Path, save_dir: Path | None = None) -> EvalPoint:
    rollout_id = parse_rollout_id(path.name)
    if rollout_id is None:
        raise FileNotFoundError(f"{path}: an HF snapshot to evaluate must be an export dir <export>/<rollout_id>/")
    meta = _meta(save_dir / str(rollout_id)) if save_dir else None
    step = meta["weight_version"] + 1 if meta and "weight_version" in meta else rollout_id + 2
    return EvalPoint(step, path, "snapshot", rollout_id)


def _numbered(root: Path) -> list[Path]:
    return sorted((p for p in root.iterdir() if p.is_dir() and parse_rollout_id(p.name) is not None), key=lambda p: int(p.name))


def kind_of(target: Path) -> Literal["checkpoint", "snapshot", "save_dir", "export_dir"]:
    if (target / META_FILE).exists():
        return "checkpoint"
    if (target / "config.json").exists():
        return "snapshot"
    children = _numbered(target) if target.is_dir() else []
    if any((c / META_FILE).exists() or (c / "model").is_dir() for c in children) or (target / "latest").exists():
        return "save_dir"
    if children:
        return "export_dir"
    raise FileNotFoundError(f"{target}: nothing to evaluate (not a checkpoint, a save dir, an HF snapshot or an export dir)")


def find_points(target: Path, which: Literal["latest", "all"]) -> list[EvalPoint]:
    """The points under ``target`` in step order (``latest``: the newest complete one only)."""
    target = Path(target).absolute()
    kind = kind_of(target)
    if kind == "checkpoint":
        return [checkpoint_point(target)]
    save_dir = _sibling_save_dir(target.parent if kind == "snapshot" else target)
    if kind == "snapshot":
        return [snapshot_point(target, save_dir)]
    if kind == "save_dir":
        if which == "latest":
            info = find_latest(target)
            return [checkpoint_point(info.path)] if info else []
        return sorted((checkpoint_point(p) for p in _numbered(target)), key=lambda p: p.step)
    if which == "latest":
        complete = list_exports(target)
        return [snapshot_point(complete[-1][1], save_dir)] if complete else []
    return sorted((snapshot_point(p, save_dir) for p in _numbered(target)), key=lambda p: p.step)


def _sibling_save_dir(export_dir: Path) -> Path | None:
    candidate = export_dir.parent / "checkpoints"
    return candidate if candidate.is_dir() else None


def run_dir_of(target: Path) -> Path | None:
    """The run dir holding ``target`` (found by its mlflow_run.json marker), up to two levels up."""
    for d in (target, *list(target.parents)[:3]):
        if (d / RUN_MARKER).is_file():
            return d
    return None


def find_run(target: Path, points: list[EvalPoint], tracking_uri: str | None) -> RunRef:
    """Run id: a checkpoint's meta ``mlflow_run_id``, else the run dir's marker. Tracking URI: the
    one given, else the marker's, else the checkpoint's (a save dir outside the run dir), else
    MLFLOW_TRACKING_URI, else the run dir's local store."""
    target = Path(target).absolute()
    run_dir = run_dir_of(target)
    marker = json.loads((run_dir / RUN_MARKER).read_text()) if run_dir else {}
    meta = next((m for p in points if p.kind == "checkpoint" and (m := _meta(p.path))), None)
    if meta is None and run_dir and (run_dir / "checkpoints").is_dir():
        latest = find_latest(run_dir / "checkpoints")
        meta = latest.meta if latest else None
    meta = meta or {}
    run_id = meta.get("mlflow_run_id") or marker.get("run_id")
    uri = tracking_uri or marker.get("tracking_uri") or meta.get("mlflow_tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
    if uri is None and run_dir is not None:
        uri = f"sqlite:///{run_dir / 'mlflow.db'}"
    if uri is None:
        raise FileNotFoundError(
            f"{target}: cannot tell which MLflow store holds its run (no {RUN_MARKER} in its run dir); "
            "pass --mlflow-tracking-uri (or set MLFLOW_TRACKING_URI)"
        )
    return RunRef(run_id, uri, run_dir, meta)

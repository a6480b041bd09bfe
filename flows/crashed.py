"""A flow run killed outright (SIGKILL of its process or its worker) runs no failure hook: its MLflow run stays
RUNNING. The next thing that sees its run dir marks it as Prefect would have: FAILED, ``miles.failure`` = crashed,
``miles.resume_from_rollout`` = the rollout a rerun resumes at. Those are the next train run on that dir (before it
re-attaches the run), ``miles serve`` before its worker starts (every run dir under the runs root), and ``miles eval``
of the run's checkpoints. A run dir whose lock a live process holds (runlock) is never touched: its run is live.
"""

from __future__ import annotations

import fcntl
import json
import logging
from pathlib import Path

from miles_core.runlock import LOCK_FILE

log = logging.getLogger("miles")
CRASHED = "crashed"


def in_use(run_dir: Path) -> bool:
    """A live process holds the run dir's lock (the OS drops it when the holder dies, SIGKILL included)."""
    path = run_dir / LOCK_FILE
    if not path.exists():
        return False
    with open(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False


def mark_crashed(run_dir: Path, *, held: bool = False) -> str | None:
    """Mark the MLflow run of ``run_dir`` (its mlflow_run.json) FAILED as crashed when it is still RUNNING and no live
    process holds the dir (``held``: the caller holds the lock itself) -> the run id marked, else None."""
    marker = run_dir / "mlflow_run.json"
    if not marker.is_file() or (not held and in_use(run_dir)):
        return None
    from mlflow.exceptions import MlflowException

    from miles_core.tracking.mlflow_tracker import mlflow_client

    info = json.loads(marker.read_text())
    client = mlflow_client(info["tracking_uri"])
    try:
        run = client.get_run(info["run_id"])
    except MlflowException:
        return None
    if run.info.status != "RUNNING":
        return None
    resume = _resume_from(run_dir, run.data.params)
    client.set_tag(run.info.run_id, "miles.failure", CRASHED)
    client.set_tag(run.info.run_id, "miles.resume_from_rollout", str(resume))
    client.set_terminated(run.info.run_id, status="FAILED")
    log.warning("MLflow run %s of %s was left RUNNING by a flow run that died: marked FAILED (miles.failure=crashed, "
                "resume from rollout %d)", run.info.run_id, run_dir, resume)
    return run.info.run_id


def _resume_from(run_dir: Path, params: dict[str, str]) -> int:
    save = params.get("checkpoint.save")  # a string param is logged as is, None as "null"
    save = None if save in (None, "null") else save
    return resume_rollout(Path(save) if save else run_dir / "checkpoints")


def latest_meta(save_dir: Path) -> dict | None:
    """The meta.json of the latest complete checkpoint of either trainer, None if there is none: a torch_dist
    checkpoint of the Megatron trainer that ``latest`` names (complete by its manifest), else the torch layout's
    (checksums verified). The Megatron layout is looked at first, so its dirs are not reported as broken torch ones."""
    from miles_core.checkpoint import find_latest
    from miles_core.checkpoint._fs import marker_problem

    pointer = Path(save_dir) / "latest"
    name = pointer.read_text().strip() if pointer.is_file() else ""
    path = Path(save_dir) / name
    if name.isdigit() and (path / "torch_dist").is_dir():
        return json.loads((path / "meta.json").read_text()) if marker_problem(path) is None else None
    info = find_latest(save_dir)
    return None if info is None else info.meta


def resume_rollout(save_dir: Path) -> int:
    """The rollout a rerun resumes at: after the latest complete checkpoint of either trainer (latest_meta), else 0."""
    meta = latest_meta(save_dir)
    return 0 if meta is None else int(meta["rollout_id"]) + 1


def sweep(root: Path) -> list[str]:
    """Mark every crashed run under ``root`` (run dirs ``root/<name>`` and ``root/<deployment>/<name>``)."""
    markers = [*root.glob("*/mlflow_run.json"), *root.glob("*/*/mlflow_run.json")] if root.is_dir() else []
    return [r for m in sorted(markers) if (r := mark_crashed(m.parent))]

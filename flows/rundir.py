"""Run dirs follow Prefect's meaning of a run.

A run of a deployment (the UI's Quick run or Custom run, `prefect deployment run`, a schedule) whose form leaves
``misc.run_dir`` empty gets a run dir of its own, ``<runs root>/<deployment>/<flow-run name>``, and so its own
checkpoints and its own MLflow run; a Retry of that flow run (same flow-run id, same name) comes back to it and
resumes. The deployment's runs share one MLflow store, ``<runs root>/<deployment>/mlflow.db`` (one experiment,
every run in one runs table), unless ``tracking.mlflow_tracking_uri`` names one. A run dir named in the form is
used as given, with the MLflow store its ``mlflow_run.json`` records: that is how a user continues a run in a new
flow run. Runs outside a deployment (``miles train``) keep ``runs/<recipe>``. The runs root is ``runs`` under the
worker's directory, or ``MILES_RUNS_ROOT``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from miles_core.config import TrainConfig

from .links import FlowRun, current_flow_run

RUNS_ROOT_ENV = "MILES_RUNS_ROOT"
MARKER = "flow_run.json"  # the flow run a run dir belongs to: another flow run of the same name gets another dir


def runs_root(env: Mapping[str, str] = os.environ, cwd: Path | None = None) -> Path:
    """Where deployment runs put their run dirs: ``MILES_RUNS_ROOT``, else runs/ of ``cwd`` (the worker's: the checkout)."""
    root = Path(env.get(RUNS_ROOT_ENV, "runs"))
    return root if root.is_absolute() else (cwd or Path.cwd()) / root


def for_flow_run(cfg: TrainConfig, fr: FlowRun | None = None) -> TrainConfig:
    """``cfg`` with the run dir (and MLflow store) of this deployment flow run; unchanged outside a deployment or
    when the form names a run dir."""
    fr = fr if fr is not None else current_flow_run()
    if fr is None or not fr.deployment:
        return cfg
    if cfg.misc.run_dir:
        return _recorded_store(cfg)
    base = runs_root() / fr.deployment
    run_dir = _own_dir(base, fr)
    misc = cfg.misc.model_copy(update={"run_dir": str(run_dir)})
    tracking = cfg.tracking
    if not tracking.mlflow_tracking_uri:
        tracking = tracking.model_copy(update={"mlflow_tracking_uri": f"sqlite:///{base / 'mlflow.db'}"})
    return cfg.model_copy(update={"misc": misc, "tracking": tracking})


def _recorded_store(cfg: TrainConfig) -> TrainConfig:
    """A run dir named in the form with no ``tracking.mlflow_tracking_uri``: the store its mlflow_run.json records
    (a dir a deployment run made logs into the deployment's store, not ``<run dir>/mlflow.db``), so continuing it in
    a new flow run re-attaches its MLflow run."""
    marker = cfg.run_dir / "mlflow_run.json"
    if cfg.tracking.mlflow_tracking_uri or not marker.is_file():
        return cfg
    uri = json.loads(marker.read_text()).get("tracking_uri")
    if not uri:
        return cfg
    return cfg.model_copy(update={"tracking": cfg.tracking.model_copy(update={"mlflow_tracking_uri": uri})})


def _own_dir(base: Path, fr: FlowRun) -> Path:
    """<base>/<flow-run name>, claimed for this flow run id; a name another flow run holds gets its id appended."""
    for run_dir in (base / fr.name, base / f"{fr.name}-{fr.id[:8]}"):
        marker = run_dir / MARKER
        if marker.is_file() and json.loads(marker.read_text()).get("flow_run_id") != fr.id:
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"flow_run_id": fr.id, "flow_run_name": fr.name, "deployment": fr.deployment}))
        return run_dir
    raise RuntimeError(f"{base}: run dirs {fr.name} and {fr.name}-{fr.id[:8]} belong to other flow runs")


def from_deployment() -> bool:
    fr = current_flow_run()
    return bool(fr and fr.deployment)


def advice(cli: str, form: str) -> str:
    """What to set, in the words of where the run came from: the run form's fields for a deployment run."""
    return form if from_deployment() else cli

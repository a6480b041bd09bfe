"""Flow state hooks: a failed or crashed train run ends its MLflow run as FAILED with a resume hint.

Only the MLflow run this flow run opened or re-attached (``OPENED``, filled by flows/tracking.py) is touched: a run
refused before that (a changed param, a run dir in use, a bad input) leaves every MLflow run as it was.
"""

from __future__ import annotations

import logging

log = logging.getLogger("miles")
OPENED: dict[str, tuple[str, str]] = {}  # Prefect flow run id -> (MLflow run id, tracking URI) it opened or re-attached


def mark_failed(flow_run, state) -> None:
    from mlflow.tracking import MlflowClient

    from miles_core.checkpoint import find_latest
    from miles_core.config import TrainConfig

    opened = OPENED.pop(str(flow_run.id), None)
    if opened is None:
        return  # failed before opening or re-attaching an MLflow run: nothing of ours to mark
    run_id, tracking_uri = opened
    try:
        cfg = TrainConfig.model_validate(flow_run.parameters["config"])
        info = find_latest(cfg.load_dir)
    except Exception as e:  # the run is still closed below; only the resume hint is lost
        log.warning("failure hook: cannot read the run's config (%s); no resume hint", e)
        info = cfg = None
    client = MlflowClient(tracking_uri)
    if cfg is not None:
        client.set_tag(run_id, "miles.resume_from_rollout", str(info.rollout_id + 1 if info else 0))
    client.set_tag(run_id, "miles.failure", str(state.message)[:500])
    client.set_terminated(run_id, status="FAILED")

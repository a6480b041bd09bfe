"""Flow state hooks: a failed or crashed train run ends its MLflow run as FAILED with a resume hint."""

from __future__ import annotations

import json
import logging

log = logging.getLogger("miles")


def mark_failed(flow_run, state) -> None:
    from mlflow.tracking import MlflowClient

    from miles_core.checkpoint import find_latest
    from miles_core.config import TrainConfig

    try:
        cfg = TrainConfig.model_validate(flow_run.parameters["config"])
    except Exception as e:  # a config that never validated has no MLflow run to close
        log.warning("failure hook: cannot read the run's config (%s); nothing to mark", e)
        return
    marker = cfg.run_dir / "mlflow_run.json"
    if not marker.exists():
        return
    run_id = json.loads(marker.read_text())["run_id"]
    info = find_latest(cfg.load_dir)
    client = MlflowClient(cfg.tracking_uri)
    client.set_tag(run_id, "miles.resume_from_rollout", str(info.rollout_id + 1 if info else 0))
    client.set_tag(run_id, "miles.failure", str(state.message)[:500])
    client.set_terminated(run_id, status="FAILED")

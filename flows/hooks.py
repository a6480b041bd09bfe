"""Flow state hooks: a failed or crashed train run ends its MLflow run as FAILED with a resume hint; one stopped by
SIGINT or SIGTERM (flows/interrupt.py) as KILLED, ``miles.failure`` = interrupted, ``miles.interrupted`` = the signal.

Only the MLflow run this flow run opened or re-attached (``OPENED``, filled by flows/tracking.py) is touched: a run
refused before that (a changed param, a run dir in use, a bad input) leaves every MLflow run as it was. A process
killed outright runs no hook: flows/crashed.py marks its run when something next sees the run dir.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("miles")


@dataclass(frozen=True)
class Opened:
    """The MLflow run a flow run opened or re-attached, and the checkpoint dir it resumes from (its resolved config's:
    a deployment run's run dir is chosen in the flow, flows/rundir.py)."""

    run_id: str
    tracking_uri: str
    load_dir: Path


OPENED: dict[str, Opened] = {}  # Prefect flow run id -> the MLflow run it opened or re-attached


def mark_failed(flow_run, state) -> None:
    from flows.crashed import resume_rollout
    from miles_core.tracking.mlflow_tracker import mlflow_client

    opened = OPENED.pop(str(flow_run.id), None)
    if opened is None:
        return  # failed before opening or re-attaching an MLflow run: nothing of ours to mark
    try:
        resume = str(resume_rollout(opened.load_dir))  # either trainer's checkpoints
    except Exception as e:  # the run is still closed below; only the resume hint is lost
        log.warning("failure hook: cannot read the run's checkpoints (%s); no resume hint", e)
        resume = None
    from flows.interrupt import INTERRUPTED, signal_name

    client = mlflow_client(opened.tracking_uri)
    if resume is not None:
        client.set_tag(opened.run_id, "miles.resume_from_rollout", resume)
    sig = signal_name(state.data) if isinstance(state.data, BaseException) else None  # a crash's exception (in-process)
    if sig is not None:
        client.set_tag(opened.run_id, "miles.interrupted", f"{sig}; resume from rollout {resume}")
    client.set_tag(opened.run_id, "miles.failure", INTERRUPTED if sig else str(state.message)[:500])
    client.set_terminated(opened.run_id, status="KILLED" if sig else "FAILED")

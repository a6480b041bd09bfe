"""One tracker fan-out: MLflow primary, W&B / TensorBoard / Prometheus mirrors, the same keys at the
same step axes (rollout/step, train/step, eval/step).

Resume rule, per tracker: a step is logged to a tracker only when it is above that tracker's
high-water mark on the step's axis. MLflow's marks come from its metric history; each mirror knows
its own (TensorBoard reads its event files, W&B its ledger in the run dir, Prometheus keeps no
history), so a resumed run duplicates no step on any tracker, even one a mirror got before a crash
and MLflow did not.

A mirror is a table entry (``MIRRORS``): ``open(spec) -> Mirror`` with ``marks``, ``log``, ``flush``
and ``close``. The libraries are imported inside their modules, only when the mirror is on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Protocol

from .mlflow_tracker import MlflowTracker

log = logging.getLogger(__name__)


class Mirror(Protocol):
    name: str
    link: str  # where a user looks at it (a URL or a directory), set as the MLflow tag miles.<name>
    marks: dict[str, int]  # axis -> the highest step this tracker had when opened (absent: none); fixed while it runs

    def log(self, metrics: dict[str, float], axis: str, step: int) -> None: ...

    def log_extra(self, metrics: dict[str, float], axis: str, step: int) -> None: ...

    def flush(self) -> None: ...

    def close(self, status: str) -> None: ...


@dataclass(frozen=True)
class MirrorSpec:
    """What a mirror needs to open: the tracking config group, the run's identity and its params."""

    tracking: Any  # miles_core.config.TrackingConfig
    run_dir: Path
    mlflow_run_id: str
    run_name: str
    params: dict[str, Any]
    steps_per_rollout: int = 1  # num_steps_per_rollout: train steps per rollout (wandb_always_use_train_step)
    engine_urls: Callable[[], list[str]] = lambda: []  # the HTTP engines' base URLs now (the dashboard's scraper)
    log_artifacts: Callable[[str, str], None] | None = None  # (local dir, artifact path) into the MLflow run
    peers: tuple = ()  # the mirrors opened before this one (the dashboard forwards to the Prometheus mirror)


def _wandb(spec: MirrorSpec) -> Mirror:
    from .wandb_tracker import WandbMirror

    return WandbMirror.open(spec)


def _tensorboard(spec: MirrorSpec) -> Mirror:
    from .tensorboard_tracker import TensorboardMirror

    return TensorboardMirror.open(spec)


def _prometheus(spec: MirrorSpec) -> Mirror:
    from .prometheus_tracker import PrometheusMirror

    return PrometheusMirror.open(spec)


def _dashboard(spec: MirrorSpec) -> Mirror:
    from .dashboard.collector import DashboardMirror

    forward = None
    if spec.tracking.dashboard_forward_prometheus:  # the rules: only with use_prometheus, opened before it (MIRRORS' order)
        forward = next(m for m in spec.peers if m.name == "prometheus").set_gauges
    return DashboardMirror(spec, forward=forward)


# config switch -> opener; the order is the order mirrors are opened and logged to
MIRRORS: dict[str, Callable[[MirrorSpec], Mirror]] = {
    "use_wandb": _wandb,
    "use_tensorboard": _tensorboard,
    "use_prometheus": _prometheus,
    "use_miles_dashboard": _dashboard,
}


def open_mirrors(spec: MirrorSpec) -> list[Mirror]:
    """The run log (always) and the mirrors the config switches on; those opened are closed if a later one fails."""
    from .runlog import RunLogMirror

    opened: list[Mirror] = [RunLogMirror.open(spec)]
    try:
        for switch, opener in MIRRORS.items():
            if getattr(spec.tracking, switch):
                opened.append(opener(replace(spec, peers=tuple(opened))))
    except Exception:
        for m in opened:
            m.close("FAILED")
        raise
    return opened


@dataclass
class RunTracker:
    """MlflowTracker plus mirrors and per-axis high-water marks: a resumed run re-logs nothing a tracker has.

    ``marks`` are MLflow's (the primary; flows read them to skip an eval point already logged)."""

    mlflow: MlflowTracker
    marks: dict[str, int] = field(default_factory=dict)
    mirrors: list[Mirror] = field(default_factory=list)
    closed: bool = False
    plot_dir: Path | None = None  # where log_plots draws (the run dir's plots/); None: no plots
    plots: list[Path] = field(default_factory=list)  # the PNGs of the last log_plots

    def log(self, metrics: dict[str, float], axis: str, step: int) -> None:
        """Log metrics and the axis value at ``step`` on every tracker that does not have that step yet."""
        row = {**metrics, axis: step}
        if step > self.marks.get(axis, -1):
            self.mlflow.log_metrics(row, step=step)
        for m in self.mirrors:
            if step > m.marks.get(axis, -1):
                m.log(row, axis, step)

    def log_extra(self, metrics: dict[str, float], axis: str, step: int) -> None:
        """More metrics at a step ``log`` wrote in this process (timings of save and sync, skipped evals)."""
        if not metrics:
            return
        if step > self.marks.get(axis, -1):
            self.mlflow.log_metrics(metrics, step=step)
        for m in self.mirrors:
            if step > m.marks.get(axis, -1):
                m.log_extra(metrics, axis, step)

    def log_plots(self) -> list[Path]:
        """Draw the run's curves into ``plot_dir`` and log them to MLflow under plots/ (eval points, the end)."""
        from . import plots
        from .mlflow_tracker import histories

        if self.plot_dir is None:
            return []
        self.mlflow.flush()
        keys = plots.wanted_keys(self.mlflow.client.get_run(self.mlflow.run_id).data.metrics)
        written = plots.render(histories(self.mlflow.client, self.mlflow.run_id, keys), self.plot_dir)
        if written:
            self.mlflow.log_artifacts(str(self.plot_dir), "plots")
        self.plots = written
        return written

    def flush(self) -> None:
        """Everything logged so far is on every tracker's store (before a checkpoint that counts on it)."""
        self.mlflow.flush()
        for m in self.mirrors:
            m.flush()

    def end(self, status: str = "FINISHED") -> None:
        """Draw the final plots (a finished run), end the MLflow run and close the mirrors."""
        if status == "FINISHED":
            self.log_plots()
        self.mlflow.end(status)
        self.close(status)

    def close(self, status: str = "FAILED") -> None:
        """Close the mirrors (idempotent; the MLflow run of a failed flow is ended by the failure hook)."""
        if self.closed:
            return
        self.closed = True
        for m in self.mirrors:
            try:
                m.close(status)
            except Exception as e:  # one mirror failing to close must not hide the run's own error
                log.warning("closing the %s tracker failed: %s", m.name, e)

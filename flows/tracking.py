"""Tracking wiring of the train flow: open or re-attach the MLflow run, open the mirrors (W&B,
TensorBoard, Prometheus: miles_core/tracking/fanout.py), skip steps already logged on resume.

Re-attach: the checkpoint's run; without a checkpoint, the unfinished run the run dir's mlflow_run.json
names (a kill before the first checkpoint leaves no second, orphan run). A re-attached run drops the
tags of its previous failure. ``OPENED`` (flows/hooks.py) remembers which MLflow run each flow run opened or re-attached:
the failure hooks touch that run only, never one another flow run owns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from flows.hooks import OPENED, Opened  # absolute: a deployment loads flows/train.py under another module name
from miles_core.config import ConfigError, TrainConfig
from miles_core.env import cache_dir
from miles_core.tracking import MlflowTracker, flatten, sanitize_key
from miles_core.tracking.fanout import MirrorSpec, RunTracker, open_mirrors
from miles_core.tracking.mlflow_tracker import mlflow_client, param_str

from .links import run_name, tag_run
from .rundir import advice
from .runlog import attach_prefect_logs

AXES = ("rollout/step", "train/step", "eval/step")
# Params a resumed run may change without a new run: how long to run is not part of the recipe's identity.
MUTABLE_PARAMS = {"rollout.num_rollout", "derived.num_rollout", "tracking.mlflow_new_run", "tracking.mlflow_ui_url",
                  "data.debug_exit_after_rollout",  # (a run stopped by it resumes without it, or with another)
                  "checkpoint.save_trigger_sentinel"}  # (where an operator may ask for a save is not the recipe)
# nor is the spelling of the run dir (a form continuing a deployment run names the dir its run was given: the
# dir's own mlflow_run.json, not this param, says which run it holds)
MUTABLE_PARAMS |= {"misc.run_dir"}
# nor are the trackers that watch it (a resume may turn a mirror on or off, or move its endpoint)
MUTABLE_PARAMS |= {f"tracking.{k}" for k in ("use_wandb", "wandb_mode", "wandb_dir", "use_tensorboard", "tensorboard_dir",
                                             "use_prometheus", "prometheus_port", "prometheus_host")}
# nor is the launcher's report of the environment it runs in (env_report: each launch writes its own)
MUTABLE_PARAMS |= {"misc.env_report"}
MUTABLE_PARAMS |= {f"tracking.{k}" for k in ("use_miles_dashboard", "dashboard_flush_interval", "dashboard_gpu_sample_interval",
                                             "dashboard_sglang_scrape_interval", "dashboard_sglang_scrape_mode",
                                             "dashboard_sglang_metrics", "dashboard_forward_prometheus")}
FAILURE_TAGS = ("miles.failure", "miles.resume_from_rollout", "miles.interrupted")


def config_params(cfg: TrainConfig, derived: dict) -> dict[str, object]:
    return {**cfg.model_dump(mode="json"), "derived": derived}


def refuse_changed_params(client, run_id: str, params: dict, log) -> None:
    """Refuse a resume of MLflow run ``run_id`` whose logged params differ from ``params`` (MUTABLE_PARAMS aside),
    naming them and what to set (CLI flags, or the form's fields for a deployment run)."""
    logged = client.get_run(run_id).data.params
    changed = [
        k for k, v in flatten(params).items()
        if k not in MUTABLE_PARAMS and sanitize_key(k) in logged and logged[sanitize_key(k)] != param_str(v)
    ]
    if changed:
        log.error("resume refused: MLflow run %s was logged with other values of %s", run_id, changed)
        raise ConfigError(f"resume of MLflow run {run_id} with changed params {changed}; restore them, or " + advice(
            "start a new run with a new --save dir (or --load pointing at the old one)",
            "clear misc.run_dir (a new run dir for this flow run), or set tracking.mlflow_new_run to log into a new MLflow run"))


def check_resume(cfg: TrainConfig, run_id: str | None, derived: dict) -> None:
    """Before anything else looks at a finished run: a resume into ``run_id`` with changed params is refused."""
    if run_id is not None:
        refuse_changed_params(mlflow_client(cfg.tracking_uri), run_id, config_params(cfg, derived), attach_prefect_logs())


def check_resume_early(cfg: TrainConfig) -> None:
    """Before any model loads or a progress bar shows: a resume into the MLflow run of the newest checkpoint with changed
    config fields is refused (its derived values are compared by check_resume, once the data is prepared)."""
    if cfg.tracking.mlflow_new_run:
        return
    from flows.crashed import latest_meta

    meta = latest_meta(cfg.load_dir)  # either trainer's checkpoints
    run_id = None if meta is None else meta.get("mlflow_run_id")
    if run_id is not None:
        refuse_changed_params(mlflow_client(cfg.tracking_uri), run_id, cfg.model_dump(mode="json"), attach_prefect_logs())


def open_run(cfg: TrainConfig, run_id: str | None, derived: dict, engine_urls: Callable[[], list[str]] = lambda: []) -> RunTracker:
    """New run with params, or re-attach ``run_id`` (or the run dir's unfinished run) after checking the params did not change.
    ``engine_urls``: the run's HTTP engines now (the dashboard scrapes them; none for an in-process engine)."""
    log = attach_prefect_logs()
    if run_id is None and not cfg.tracking.mlflow_new_run:
        run_id = unfinished_run(cfg)
    local_store = cfg.tracking_uri.startswith("sqlite:")
    artifacts = _artifact_root(cfg) if local_store else None  # never ./mlruns of the cwd
    tracker = MlflowTracker(cfg.tracking_uri, cfg.tracking.mlflow_experiment_name, run_name(cfg),
                            run_id, artifact_location=artifacts, asynchronous=True,  # flushed before each save and at the end
                            empty_stores=cache_dir() / "mlflow")  # a new store is a copy: no migrations per run
    params = config_params(cfg, derived)
    if run_id is None:
        tracker.log_params(params)
        report = env_report(cfg, tracker)
        _opened(tracker.run_id, cfg.tracking_uri, cfg.load_dir)
        log.info("MLflow run %s opened in %s", tracker.run_id, cfg.tracking_uri)
        return RunTracker(tracker, mirrors=_mirrors(cfg, tracker, params, engine_urls, report), plot_dir=cfg.run_dir / "plots")
    refuse_changed_params(tracker.client, run_id, params, log)
    report = env_report(cfg, tracker)
    tracker.client.set_terminated(run_id, status="RUNNING")
    _opened(run_id, cfg.tracking_uri, cfg.load_dir)
    tags = tracker.client.get_run(run_id).data.tags
    for tag in FAILURE_TAGS:
        if tag in tags:
            tracker.client.delete_tag(run_id, tag)
    marks = {axis: max((m.step for m in tracker.client.get_metric_history(run_id, axis)), default=-1) for axis in AXES}
    log.info("resuming MLflow run %s: steps already logged (not logged again) up to %s", run_id, marks)
    return RunTracker(tracker, marks, _mirrors(cfg, tracker, params, engine_urls, report), plot_dir=cfg.run_dir / "plots")


def _artifact_root(cfg: TrainConfig) -> str:
    """<the SQLite store's dir>/mlruns: the run dir's for its own store, the deployment's for a store its runs share."""
    store = Path(cfg.tracking_uri.removeprefix("sqlite:///"))
    return (store.parent / "mlruns").absolute().as_uri()


def env_report(cfg: TrainConfig, tracker: MlflowTracker):
    """env_report set: the driver's node report (pip packages, git state, the launcher's report) printed and logged to
    MLflow (miles_core/tracking/env_report.py); -> it, or None when env_report is empty. A resumed run logs it again
    (the artifact replaced, params it did not have added)."""
    from miles_core.tracking.env_report import collect, log_report

    report = collect(cfg.misc.launcher_env_report)
    if report is not None:
        log_report(tracker, report)
    return report


def _mirrors(cfg: TrainConfig, tracker: MlflowTracker, params: dict, engine_urls: Callable[[], list[str]],
             report=None) -> list:
    """Tag the run with this flow run (flows/links.py), then open the mirrors the config turns on (their config: the
    params, and the launcher's env report as launcher_env_report, the reference's W&B config key)."""
    if report is not None:
        params = {**params, "launcher_env_report": report.launcher_env_report}
    tag_run(tracker)
    name = tracker.client.get_run(tracker.run_id).info.run_name
    mirrors = open_mirrors(MirrorSpec(tracking=cfg.tracking, run_dir=cfg.run_dir, mlflow_run_id=tracker.run_id, run_name=name,
                                       params=params, steps_per_rollout=cfg.num_steps_per_rollout, engine_urls=engine_urls,
                                       log_artifacts=tracker.log_artifacts))
    tracker.set_tags({f"miles.{m.name}": m.link for m in mirrors if m.link})
    return mirrors


def unfinished_run(cfg: TrainConfig) -> str | None:
    """The run named by <run_dir>/mlflow_run.json when it is in this tracking store and did not finish (killed or
    failed before its first checkpoint), else None."""
    marker = cfg.run_dir / "mlflow_run.json"
    if not marker.is_file():
        return None
    info = json.loads(marker.read_text())
    if info.get("tracking_uri") != cfg.tracking_uri:
        return None
    from mlflow.exceptions import MlflowException

    try:
        run = mlflow_client(cfg.tracking_uri).get_run(info["run_id"])
    except MlflowException:
        return None
    return run.info.run_id if run.info.status != "FINISHED" and run.info.lifecycle_stage == "active" else None


def _opened(run_id: str, tracking_uri: str, load_dir: Path) -> None:
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is not None and ctx.flow_run is not None:
        OPENED[str(ctx.flow_run.id)] = Opened(run_id, tracking_uri, load_dir)

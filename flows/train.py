"""The train flow: REFERENCE §1 as a numbered sequence of tasks.

    0. prepare (convert model, load data) -> restore the latest checkpoint -> open/re-attach MLflow
    1. sync weights (version 1) and eval before training unless skip_eval_before_train
    for each rollout i:
    2. generate + reward   3. train (old log-probs, advantages, optimizer steps)
    4. save if due         5. sync weights (version + 1)   6. eval if due   7. export if due

debug_exit_after_rollout N stops the loop after N rollouts of this invocation (after their eval).
A resume starts after the checkpoint's rollout i, first running what was due after that save and did
not complete (its eval, its export; the sync is redone by restore): the stage ledger records them.
async_mode one_step submits generate(i + 1) before train(i), so the two task runs overlap (rollout
i + 1 is one weight sync stale); it is waited for before the weight sync and before a save.
async_mode fully: generate(i) takes groups from a background worker's buffer (runtime side), and
weights sync every update_weights_interval rollouts.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from dataclasses import dataclass

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.context import get_run_context

from miles_core import assemble, runlock
from miles_core.config import ConfigError, TrainConfig
from miles_core.env import cache_dir
from miles_core.preflight import preflight
from miles_core.runtime import registry
from miles_core.runtime.stage_ledger import StageLedger
from miles_core.tracking import progress
from miles_core.training.profiler import profile_files
from tasks.convert import convert
from tasks.export import export_live
from tasks.prepare import prepare
from tasks.stages import generate, restore, sample_rows, save, train_step, update_weights
from tasks.timeouts import timed

from .evaluate import eval_at, finish_evals
from .crashed import mark_crashed
from .interrupt import rearm, stop_if_interrupted
from .promotion import register_export
from .rundir import advice, for_flow_run
from .summary import summary_markdown
from .runlog import flush_prefect_logs
from .tracking import RunTracker, check_resume, check_resume_early, open_run

# one_step's generate(i + 1) runs in a worker thread, where Prefect cannot interrupt a blocking call (it would only
# warn, once per task run): that task run has no timeout of its own, and the flow's wait on it is bounded instead.
GENERATE_AHEAD = generate.with_options()
GENERATE_AHEAD.timeout_seconds = None  # with_options(timeout_seconds=None) keeps the original's
log = logging.getLogger("miles")
PROGRESS_EVERY_S = 5.0  # the Prefect progress artifact is updated at most this often (and after the last rollout)


class NothingToDo(ConfigError):
    """The run dir's checkpoints already hold every rollout of the config."""


def due(interval: int | None, rollout_id: int, num_rollout: int) -> bool:
    """An action with interval k runs after rollout i when (i+1) % k == 0, or i is the last rollout."""
    return interval is not None and ((rollout_id + 1) % interval == 0 or rollout_id == num_rollout - 1)


@dataclass
class TrainRun:
    """One train flow run: its key in the runtime registry, config, length, tracker and stage ledger."""

    key: str
    config: TrainConfig
    num_rollout: int
    model_path: str
    tracker: RunTracker
    ledger: StageLedger

    def eval_due(self, i: int) -> bool:
        return self.config.eval.enabled and due(self.config.eval.eval_interval, i, self.num_rollout)

    def export_due(self, i: int) -> bool:
        return due(self.config.checkpoint.export_interval, i, self.num_rollout)


def _on_failure(flow, flow_run, state) -> None:
    """End the MLflow run as FAILED and leave a resume hint (the rerun resumes from the last checkpoint)."""
    from flows.hooks import mark_failed

    mark_failed(flow_run, state)


@flow(name="train", on_failure=[_on_failure], on_crashed=[_on_failure], validate_parameters=True)
def train(config: TrainConfig) -> dict:
    """Train a recipe end to end: convert, rollouts, training steps, evaluation, checkpoints and exports, tracked in MLflow.

    Args:
        config: The recipe's resolved config, by argument group. A run of a deployment trains in its own run dir
            (runs/‹deployment›/‹flow-run name›) unless misc.run_dir names one to continue; a Retry resumes it.
    """
    rearm()  # the CLI's SIGINT/SIGTERM: recorded, acted on between stages (flows/interrupt.py)
    assemble.check(config, "flow parameter config")  # names against the registries: a deployment run's form skips the CLI
    config = for_flow_run(config)  # a deployment run's own run dir (flows/rundir.py)
    preflight(config)  # inputs, outputs, devices: one clear error before any model loads
    lock = runlock.hold(config)  # one run per run dir and save dir; a second is refused naming the holder
    run_key = f"{config.misc.recipe}:{get_run_context().flow_run.id}"
    run = None
    try:
        check_resume_early(config)  # changed params: refused before the model converts or loads
        timed(convert, config)(config.checkpoint.hf_checkpoint, str(cache_dir()))
        facts = timed(prepare, config)(run_key, config)
        n = facts["num_rollout"]
        stop_if_interrupted()
        meta = timed(restore, config)(run_key)
        start = (meta["rollout_id"] + 1 if config.data.start_rollout_id is None else config.data.start_rollout_id) if meta else 0
        derived = {"global_batch_size": config.global_batch_size, "num_steps_per_rollout": config.num_steps_per_rollout,
                   "num_rollout": n, "num_prompts": facts["num_prompts"], "dropped_prompts": facts["dropped_prompts"],
                   "trainer": facts["trainer"]}
        reattach = meta["mlflow_run_id"] if meta and not config.tracking.mlflow_new_run else None
        check_resume(config, reattach, derived)  # changed params are named before "nothing to do"
        _refuse_nothing_to_do(config, start, n)
        mark_crashed(config.run_dir, held=True)  # a killed run before this one left its MLflow run RUNNING
        tracker = open_run(config, reattach, derived, engine_urls=registry.get_runtime(run_key).engine_urls)
        run = TrainRun(run_key, config, n, facts["model_path"], tracker, StageLedger(config.run_dir))
        run.ledger.forget_after(start - 1)
        _record_run(config, run.tracker)
        if not meta:
            update_weights(run_key)  # 1. version 1
            if config.eval.enabled and not config.eval.skip_eval_before_train:
                eval_at(run_key, run.tracker, config)
        else:
            _finish_interrupted(run, meta["rollout_id"])
        rewards = _rollout_loop(run, start)
        registry.get_runtime(run_key).wait_saves()  # async_save: the last checkpoint is complete before the run finishes
        finish_evals(run_key, run.tracker, config)  # background evals of eval_mode snapshot land before the run ends
        registry.get_runtime(run_key).finish_checks()  # ci_metric_checker_key: failed unless an eval point reached it
        run.tracker.end("FINISHED")  # the final plots, then MLflow and the mirrors
        return _summary(config, run.tracker, rewards, start, n)
    finally:
        if run is not None:
            run.tracker.close()  # the mirrors (W&B, TensorBoard, Prometheus); no-op after end()
        registry.release(run_key)
        lock.release()


def _refuse_nothing_to_do(config: TrainConfig, start: int, n: int) -> None:
    """A run whose checkpoints already hold every rollout would train nothing: refused, not shown as a training."""
    if start >= n:
        raise NothingToDo(f"nothing to do: {config.run_dir} already has all {n} rollouts (checkpoint of rollout {start - 1}); "
                          + advice("raise --num-rollout to continue it, or give a new --run-dir",
                                   "raise rollout.num_rollout to continue it, or clear misc.run_dir for a new run"))


def _rollout_loop(run: TrainRun, start: int) -> list[dict]:
    n = run.num_rollout
    artifact = create_progress_artifact(progress=100.0 * start / n, key="train-progress", description=f"rollouts of {run.config.misc.recipe}")
    rewards, pending, shown = [], None, time.monotonic()
    for i in range(start, n):
        stop_if_interrupted()
        metrics, pending = _one_rollout(run, i, pending)
        rewards.append(metrics)
        if i == n - 1 or time.monotonic() - shown >= PROGRESS_EVERY_S:  # one API call per rollout is too many at small steps
            update_progress_artifact(artifact, progress=100.0 * (i + 1) / n)
            shown = time.monotonic()
        progress.emit(i, n, rewards[-1])
        flush_prefect_logs()  # a kill loses the logs of the current rollout at most
        stop_after = run.config.data.debug_exit_after_rollout
        if stop_after is not None and i - start + 1 >= stop_after:  # the reference's train loop: after the eval
            if pending is not None:
                pending.wait()  # one_step's rollout i + 1, already started: written, reused by a resume
            log.info("debug_exit_after_rollout=%d reached at rollout %d: stopping", stop_after, i)
            break
    return rewards


def _one_rollout(run: TrainRun, i: int, pending):
    """-> (rollout metrics, the one_step generate future of rollout i + 1 or None)."""
    key, cfg, n = run.key, run.config, run.num_rollout
    # 2. generate + reward (one_step: rollout i + 1 starts now, beside the train step)
    ahead_timeout = getattr(timed(generate, cfg), "timeout_seconds", None)
    metrics = pending.result(timeout=ahead_timeout) if pending is not None else timed(generate, cfg)(key, i)
    stop_if_interrupted()  # a signal: the stage done is kept (its rollout file), the rest of the rollout not started
    nxt = GENERATE_AHEAD.submit(key, i + 1) if cfg.rollout.async_mode == "one_step" and i + 1 < n else None
    # 3. train
    out = timed(train_step, cfg)(key, i)
    metrics |= out.rollout
    _track_rollout(run, i, metrics, out.steps)  # before the save: a checkpoint never precedes its metrics
    sync_due = cfg.rollout.async_mode == "off" or due(cfg.rollout.update_weights_interval, i, n)
    external_save = _save_triggered(cfg, sync_due)
    save_due = external_save or due(cfg.checkpoint.save_interval, i, n) or i == n - 1
    if nxt is not None and (save_due or sync_due):
        nxt.wait(timeout=ahead_timeout)  # engines are not updated under a running generation; a checkpoint counts on rollout i + 1 being written
    perf = {}
    stop_if_interrupted()  # before the save: the run resumes from the last checkpoint, redoing this rollout exactly
    # 4. save
    if save_due:
        run.tracker.flush()  # asynchronous metrics: on every tracker's store before the checkpoint that counts on them
        perf |= timed(save, cfg)(key, i, {"mlflow_run_id": run.tracker.mlflow.run_id, "mlflow_tracking_uri": cfg.tracking_uri,
                              "recipe": cfg.misc.recipe, "tokenizer_dir": run.model_path})
        if external_save:
            os.remove(cfg.checkpoint.save_trigger_sentinel)  # the request is served (the reference's train loop)
    # 5. sync weights
    if sync_due:
        perf |= timed(update_weights, cfg)(key)
    run.tracker.log_extra(perf, "rollout/step", i)
    _after_sync(run, i)
    return metrics, nxt


def _save_triggered(cfg: TrainConfig, sync_due: bool) -> bool:
    """save_trigger_sentinel: its file exists at this rollout's save point. Checked only where a weight sync follows
    (every rollout unless async_mode with update_weights_interval > 1): a resume syncs right after its checkpoint."""
    path = cfg.checkpoint.save_trigger_sentinel
    return path is not None and sync_due and os.path.exists(path)


def _after_sync(run: TrainRun, i: int) -> None:
    """6. eval (at the engines' weight version) and 7. export + register, when due after rollout i; each recorded
    in the stage ledger once complete, so a resume from the checkpoint of rollout i runs only what did not complete."""
    if run.eval_due(i) and not run.ledger.done(i, "eval"):
        eval_at(run.key, run.tracker, run.config)
        run.ledger.mark(i, "eval")
    if run.export_due(i) and not run.ledger.done(i, "export"):
        path = timed(export_live, run.config)(run.key, i)
        run.tracker.mlflow.flush()  # the eval of these weights is on the store before register judges the champion by it
        register_export(run.config, run.tracker.mlflow.run_id, path, i,  # behind the promotion gate (flows/promotion.py)
                        registry.get_runtime(run.key).weight_version)  # the eval/step of the exported weights
        run.ledger.mark(i, "export")


def _finish_interrupted(run: TrainRun, i: int) -> None:
    """A resume from the checkpoint of rollout i: its eval and export, if due and not completed before the kill
    (restore has redone the weight sync that followed the save)."""
    if i < run.num_rollout:
        _after_sync(run, i)


def _track_rollout(run: TrainRun, i: int, metrics: dict[str, float], steps: list[dict[str, float]]) -> None:
    """Tracking of rollout i, in one call: per-step metrics at train/step, the rollout's at rollout/step, sample rows."""
    cfg, tracker = run.config, run.tracker
    k = cfg.num_steps_per_rollout
    for j, step in enumerate(steps):
        tracker.log(step, "train/step", i * k + j)
    tracker.log(metrics, "rollout/step", i)
    if cfg.tracking.log_samples and due(_samples_interval(cfg), i, run.num_rollout) and i > tracker.marks.get("rollout/step", -1):
        tracker.mlflow.log_table(timed(sample_rows, cfg)(run.key, i, cfg.tracking.log_samples), f"samples/rollout_{i:05d}.json")
    if cfg.misc.use_pytorch_profiler or cfg.misc.record_memory_history:  # the traces and snapshots written so far
        tracker.mlflow.log_new_files(profile_files(cfg), "profile")


def _samples_interval(config: TrainConfig) -> int:
    t, e = config.tracking, config.eval
    return t.log_samples_interval or (e.eval_interval if e.enabled and e.eval_interval else 1)


def _record_run(config: TrainConfig, tracker: RunTracker) -> None:
    """Remember the MLflow run in the run dir, so failure hooks can close it even before a checkpoint (the Prefect log
    line naming the run is open_run's)."""
    import json

    config.run_dir.mkdir(parents=True, exist_ok=True)
    (config.run_dir / "mlflow_run.json").write_text(json.dumps({"run_id": tracker.mlflow.run_id, "tracking_uri": config.tracking_uri}))


def _summary(config: TrainConfig, tracker: RunTracker, rewards: list[dict], start: int, n: int) -> dict:
    raw = [m["rollout/raw_reward"] for m in rewards if "rollout/raw_reward" in m]  # custom_rollout_log_function_path may drop it
    summary = {
        "mlflow_run_id": tracker.mlflow.run_id, "tracking_uri": config.tracking_uri, "experiment_id": tracker.mlflow.experiment_id,
        "rollouts": n, "resumed_from": start, "first_reward": raw[0] if raw else None, "last_reward": raw[-1] if raw else None,
        "first3_reward": statistics.fmean(raw[:3]) if raw else None, "last3_reward": statistics.fmean(raw[-3:]) if raw else None,
    }
    create_markdown_artifact(key="train-summary", markdown=summary_markdown(config, tracker, summary))
    return summary

"""The train flow: REFERENCE §1 as a numbered sequence of tasks.

    0. prepare (convert model, load data) -> restore the latest checkpoint -> open/re-attach MLflow
    1. sync weights (version 1) and eval before training unless skip_eval_before_train
    for each rollout i:
    2. generate + reward   3. train (old log-probs, advantages, optimizer steps)
    4. save if due         5. sync weights (version + 1)   6. eval if due   7. export if due

async_mode one_step submits generate(i + 1) before train(i), so the two task runs overlap (rollout
i + 1 is one weight sync stale); it is waited for before the weight sync and before a save.
async_mode fully: generate(i) takes groups from a background worker's buffer (runtime side), and
weights sync every update_weights_interval rollouts.
"""

from __future__ import annotations

import statistics
import time

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.context import get_run_context

from miles_core.config import TrainConfig
from miles_core.runtime import registry
from miles_core.tracking import progress
from miles_core.env import cache_dir
from tasks.convert import convert
from tasks.export import export_live
from tasks.prepare import prepare
from tasks.stages import generate, restore, save, train_step, update_weights

from .evaluate import eval_at, finish_evals
from .promotion import register_export
from .summary import summary_markdown
from .tracking import RunTracker, open_run


PROGRESS_EVERY_S = 5.0  # the Prefect progress artifact is updated at most this often (and after the last rollout)


def due(interval: int | None, rollout_id: int, num_rollout: int) -> bool:
    """An action with interval k runs after rollout i when (i+1) % k == 0, or i is the last rollout."""
    return interval is not None and ((rollout_id + 1) % interval == 0 or rollout_id == num_rollout - 1)


def _on_failure(flow, flow_run, state) -> None:
    """End the MLflow run as FAILED and leave a resume hint (the rerun resumes from the last checkpoint)."""
    from flows.hooks import mark_failed

    mark_failed(flow_run, state)


@flow(name="train", on_failure=[_on_failure], on_crashed=[_on_failure], validate_parameters=True)
def train(config: TrainConfig) -> dict:
    run_key = f"{config.misc.recipe}:{get_run_context().flow_run.id}"
    convert(config.checkpoint.hf_checkpoint, str(cache_dir()))
    facts = prepare(run_key, config)
    rt = registry.get_runtime(run_key)
    n = facts["num_rollout"]
    tracker = None
    try:
        meta = restore(run_key)
        start = meta["rollout_id"] + 1 if meta else 0
        derived = {"global_batch_size": config.global_batch_size, "num_steps_per_rollout": config.num_steps_per_rollout,
                   "num_rollout": n, "num_prompts": facts["num_prompts"], "dropped_prompts": facts["dropped_prompts"]}
        reattach = meta["mlflow_run_id"] if meta and not config.tracking.mlflow_new_run else None
        tracker = open_run(config, reattach, derived)
        _record_run(config, tracker)
        if not meta:
            update_weights(run_key)
        if config.eval.enabled and not config.eval.skip_eval_before_train and start == 0:
            eval_at(run_key, tracker, rt.weight_version)
        artifact = create_progress_artifact(progress=100.0 * start / n, key="train-progress", description=f"rollouts of {config.misc.recipe}")
        rewards, pending, shown = [], None, time.monotonic()
        for i in range(start, n):
            metrics, pending = _one_rollout(run_key, i, n, config, tracker, pending)
            rewards.append(metrics)
            if i == n - 1 or time.monotonic() - shown >= PROGRESS_EVERY_S:  # one API call per rollout is too many at small steps
                update_progress_artifact(artifact, progress=100.0 * (i + 1) / n)
                shown = time.monotonic()
            progress.emit(i, n, rewards[-1])
        finish_evals(run_key, tracker)  # background evals of eval_mode snapshot land before the run ends
        tracker.end("FINISHED")
        return _summary(config, tracker, rewards, start, n)
    finally:
        if tracker is not None:
            tracker.close()  # the mirrors (W&B, TensorBoard, Prometheus); no-op after end()
        registry.release(run_key)


def _one_rollout(run_key: str, i: int, n: int, config: TrainConfig, tracker: RunTracker, pending):
    """-> (rollout metrics, the one_step generate future of rollout i + 1 or None)."""
    mode = config.rollout.async_mode
    metrics = pending.result() if pending is not None else generate(run_key, i)
    nxt = generate.submit(run_key, i + 1) if mode == "one_step" and i + 1 < n else None
    rollout_metrics, steps = train_step(run_key, i)
    metrics |= rollout_metrics
    k = config.num_steps_per_rollout
    for j, step in enumerate(steps):
        tracker.log(step, "train/step", i * k + j)
    tracker.log(metrics, "rollout/step", i)  # before the save: a checkpoint never precedes its metrics
    if config.tracking.log_samples and due(_samples_interval(config), i, n) and i > tracker.marks.get("rollout/step", -1):
        rows = registry.get_runtime(run_key).sample_rows(i, config.tracking.log_samples)
        tracker.mlflow.log_table(rows, f"samples/rollout_{i:05d}.json")
    save_due = due(config.checkpoint.save_interval, i, n) or i == n - 1
    sync_due = mode == "off" or due(config.rollout.update_weights_interval, i, n)
    if nxt is not None and (save_due or sync_due):
        nxt.wait()  # engines are not updated under a running generation; a checkpoint counts on rollout i + 1 being written
    perf = {}
    if save_due:
        tracker.flush()  # asynchronous metrics: on every tracker's store before the checkpoint that counts on them
        perf |= save(run_key, i, {"mlflow_run_id": tracker.mlflow.run_id, "recipe": config.misc.recipe,
                                  "tokenizer_dir": str(registry.get_runtime(run_key).model_path)})
    if sync_due:
        perf |= update_weights(run_key)
    tracker.log_extra(perf, "rollout/step", i)
    if due(config.eval.eval_interval, i, n) and config.eval.enabled:
        eval_at(run_key, tracker, registry.get_runtime(run_key).weight_version)
    if due(config.checkpoint.export_interval, i, n):
        path = export_live(run_key, i)
        register_export(config, tracker.mlflow.run_id, path, i)  # behind the promotion gate (flows/promotion.py)
    return metrics, nxt


def _samples_interval(config: TrainConfig) -> int:
    t, e = config.tracking, config.eval
    return t.log_samples_interval or (e.eval_interval if e.enabled and e.eval_interval else 1)


def _record_run(config: TrainConfig, tracker: RunTracker) -> None:
    """Remember the MLflow run in the run dir, so failure hooks can close it even before a checkpoint."""
    import json

    config.run_dir.mkdir(parents=True, exist_ok=True)
    (config.run_dir / "mlflow_run.json").write_text(json.dumps({"run_id": tracker.mlflow.run_id, "tracking_uri": config.tracking_uri}))
    get_run_logger().info("MLflow run %s at %s", tracker.mlflow.run_id, config.tracking_uri)


def _summary(config: TrainConfig, tracker: RunTracker, rewards: list[dict], start: int, n: int) -> dict:
    raw = [m["rollout/raw_reward"] for m in rewards]
    summary = {
        "mlflow_run_id": tracker.mlflow.run_id, "tracking_uri": config.tracking_uri, "experiment_id": tracker.mlflow.experiment_id,
        "rollouts": n, "resumed_from": start, "first_reward": raw[0] if raw else None, "last_reward": raw[-1] if raw else None,
        "first3_reward": statistics.fmean(raw[:3]) if raw else None, "last3_reward": statistics.fmean(raw[-3:]) if raw else None,
    }
    create_markdown_artifact(key="train-summary", markdown=summary_markdown(config, tracker, summary))
    return summary

"""The per-rollout stages as tasks. Each returns small dicts of metrics; the flow logs them.

Retries: generate and eval and export are retried (they are idempotent: a rollout file is
reused for the same weight version); a train step changes optimizer state, so it is never retried
— a failed step fails the flow, and the rerun resumes from the last checkpoint.

Results stay in memory (``persist_result=False``): the rollout loop resumes from checkpoints, not from
Prefect results, and not asking for persistence saves part of the result handling of each task run
(~0.5 ms of the ~5 ms Prefect spends per run here; docs/performance.md#orchestration-overhead).
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from miles_core.runtime.registry import get_runtime
from miles_core.tracking.runlog import log as run_log


@task(name="generate", task_run_name="generate-r{rollout_id}", cache_policy=NO_CACHE, persist_result=False, retries=2, retry_delay_seconds=1)
def generate(run_key: str, rollout_id: int) -> dict[str, float]:
    return get_runtime(run_key).generate(rollout_id)


@task(name="train", task_run_name="train-r{rollout_id}", cache_policy=NO_CACHE, persist_result=False, retries=0)
def train_step(run_key: str, rollout_id: int) -> tuple[dict[str, float], list[dict[str, float]]]:
    return get_runtime(run_key).train(rollout_id)


@task(name="update-weights", cache_policy=NO_CACHE, persist_result=False, retries=0)
def update_weights(run_key: str) -> dict[str, float]:
    return get_runtime(run_key).sync_weights()


@task(name="save", task_run_name="save-r{rollout_id}", cache_policy=NO_CACHE, persist_result=False, retries=1, retry_delay_seconds=1)
def save(run_key: str, rollout_id: int, state: dict) -> dict[str, float]:
    perf = get_runtime(run_key).save(rollout_id, state)
    run_log.info("checkpoint of rollout %d saved (%.2f s)", rollout_id, perf.get("perf/save_model_time", float("nan")))
    return perf


@task(name="eval", cache_policy=NO_CACHE, persist_result=False, retries=1, retry_delay_seconds=1)
def evaluate(run_key: str) -> tuple[dict[str, float], list[dict]]:
    return get_runtime(run_key).evaluate()


@task(name="export", task_run_name="export-r{rollout_id}", cache_policy=NO_CACHE, persist_result=False, retries=1, retry_delay_seconds=1)
def export(run_key: str, rollout_id: int) -> str:
    return str(get_runtime(run_key).export(rollout_id))


@task(name="restore", cache_policy=NO_CACHE, persist_result=False, retries=0)
def restore(run_key: str) -> dict | None:
    """Load the latest complete checkpoint (None: fresh start from hf_checkpoint)."""
    return get_runtime(run_key).restore()

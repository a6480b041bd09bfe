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

from miles_core.evaluation import PointResult
from miles_core.faults import inject
from miles_core.runtime.registry import get_runtime
from miles_core.tracking.runlog import log as run_log
from miles_core.training.protocol import TrainOutput
from tasks import HOUR, MINUTE


@task(name="generate", task_run_name="generate-r{rollout_id}", cache_policy=NO_CACHE, persist_result=False, retries=2, retry_delay_seconds=1,
      timeout_seconds=2 * HOUR)
def generate(run_key: str, rollout_id: int) -> dict[str, float]:
    inject("generate", rollout_id)
    return get_runtime(run_key).generate(rollout_id)


@task(name="train", task_run_name="train-r{rollout_id}", cache_policy=NO_CACHE, persist_result=False, retries=0, timeout_seconds=2 * HOUR)
def train_step(run_key: str, rollout_id: int) -> TrainOutput:
    inject("train", rollout_id)
    return get_runtime(run_key).train(rollout_id)


@task(name="update-weights", cache_policy=NO_CACHE, persist_result=False, retries=0, timeout_seconds=30 * MINUTE)
def update_weights(run_key: str) -> dict[str, float]:
    inject("sync", get_runtime(run_key).weight_version + 1)
    return get_runtime(run_key).sync_weights()


@task(name="save", task_run_name="save-r{rollout_id}", cache_policy=NO_CACHE, persist_result=False, retries=1, retry_delay_seconds=1,
      timeout_seconds=HOUR)
def save(run_key: str, rollout_id: int, state: dict) -> dict[str, float]:
    inject("save", rollout_id)
    perf = get_runtime(run_key).save(rollout_id, state)
    run_log.info("checkpoint of rollout %d saved (%.2f s)", rollout_id, perf.get("perf/save_model_time", float("nan")))
    return perf


@task(name="eval", cache_policy=NO_CACHE, persist_result=False, retries=1, retry_delay_seconds=1, timeout_seconds=2 * HOUR)
def evaluate(run_key: str) -> PointResult:
    """Inline eval of the live engines at the current weight version."""
    inject("eval", get_runtime(run_key).weight_version)
    return get_runtime(run_key).evaluate()


@task(name="export", task_run_name="export-r{rollout_id}", cache_policy=NO_CACHE, persist_result=False, retries=1, retry_delay_seconds=1,
      timeout_seconds=HOUR)
def export(run_key: str, rollout_id: int) -> str:
    inject("export", rollout_id)
    return str(get_runtime(run_key).export(rollout_id))


@task(name="sample-rows", cache_policy=NO_CACHE, persist_result=False, retries=1, retry_delay_seconds=1, timeout_seconds=10 * MINUTE)
def sample_rows(run_key: str, rollout_id: int, n: int) -> list[dict]:
    """n samples of a rollout, spread across its prompts, as table rows for the tracker."""
    return get_runtime(run_key).sample_rows(rollout_id, n)


@task(name="restore", cache_policy=NO_CACHE, persist_result=False, retries=0, timeout_seconds=HOUR)
def restore(run_key: str) -> dict | None:
    """Load the latest complete checkpoint (None: fresh start from hf_checkpoint)."""
    return get_runtime(run_key).restore()

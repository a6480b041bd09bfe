"""Export and register tasks. Exports of a saved checkpoint cache on their inputs across runs
(INPUTS + TASK_SOURCE, persisted results), so a rerun does not redo them."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import INPUTS, NO_CACHE, TASK_SOURCE

from miles_core.faults import inject
from miles_core.runtime.registry import get_runtime
from miles_core.tracking.registry import log_export
from miles_core.tracking.runlog import log as run_log
from tasks import HOUR, MINUTE


@task(name="export", task_run_name="export-r{rollout_id}", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=1, timeout_seconds=HOUR)
def export_live(run_key: str, rollout_id: int) -> str:
    """Export the live policy of a running train flow as an HF snapshot."""
    inject("export", rollout_id)
    path = str(get_runtime(run_key).export(rollout_id))
    run_log.info("export of rollout %d: %s", rollout_id, path)
    return path


@task(name="export-checkpoint", task_run_name="export-checkpoint-r{rollout_id}", cache_policy=INPUTS + TASK_SOURCE, persist_result=True,
      retries=1, retry_delay_seconds=1, timeout_seconds=HOUR)
def export_checkpoint(checkpoint_dir: str, fingerprint: str, tokenizer_dir: str, export_dir: str, rollout_id: int) -> str:
    """Checkpoint dir -> HF snapshot. ``fingerprint`` (the checkpoint's creation stamp) is part of the cache key."""
    inject("export", rollout_id)
    from miles_core.checkpoint.convert import checkpoint_to_hf

    return str(checkpoint_to_hf(Path(checkpoint_dir), Path(tokenizer_dir), Path(export_dir), rollout_id))


@task(name="register", task_run_name="register-r{rollout_id}", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2,
      timeout_seconds=30 * MINUTE)
def register(tracking_uri: str, run_id: str, export_path: str, rollout_id: int, step: int,
             model_name: str | None, champion_metric: str | None, eval_step: int | None = None, crown: bool = True) -> dict:
    """Log and register an export; ``eval_step`` is the eval/step of the exported weights (the champion is judged there);
    ``crown=False`` leaves the champion alias to a promotion gate (flows/promotion.py)."""
    inject("register", rollout_id)
    r = log_export(tracking_uri, run_id, Path(export_path), rollout_id, step, model_name, champion_metric, eval_step, crown)
    if model_name:
        run_log.info("registered %s version %s (rollout %d)%s", model_name, r.version, rollout_id,
                     f"; champion alias moved ({champion_metric} improved)" if r.champion else
                     f"; {champion_metric} judged when eval/step {eval_step} lands" if r.pending else "")
    return {"version": r.version, "artifact_uri": r.artifact_uri, "champion": r.champion, "candidate": r.candidate}

"""Conversion task: resolve and validate the initial model (torch backend: an HF dir). Cached on
its inputs across runs (INPUTS + TASK_SOURCE, persisted results)."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import INPUTS, TASK_SOURCE

from tasks import HOUR


@task(name="convert", cache_policy=INPUTS + TASK_SOURCE, persist_result=True, retries=1, retry_delay_seconds=2,
      timeout_seconds=2 * HOUR)
def convert(hf_checkpoint: str, cache_dir: str) -> dict:
    from pathlib import Path

    from miles_core.checkpoint.convert import convert_for_torch

    return convert_for_torch(hf_checkpoint, Path(cache_dir))

"""Convert/prepare: resolve and validate the model, load data, build the runtime, open tracking."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from miles_core.config import TrainConfig
from miles_core.runtime import registry
from tasks import HOUR


@task(name="prepare", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2, timeout_seconds=HOUR)
def prepare(run_key: str, config: TrainConfig) -> dict:
    """Build the live runtime of this run in this process. -> dataset and model facts."""
    from miles_core.checkpoint import validate_hf_dir

    from miles_core.runtime.placement import build_runtime

    runtime = build_runtime(config)
    summary = validate_hf_dir(runtime.model_path)
    registry.register(run_key, runtime)
    return {"model_path": str(runtime.model_path), "num_prompts": runtime.num_prompts,
            "dropped_prompts": runtime.dropped_prompts, "num_rollout": runtime.num_rollout, "model": summary,
            "trainer": runtime.trainer.run_params()}

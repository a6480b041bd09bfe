"""Placements by ``runtime``, and ``build_runtime``: config -> data (driver side) -> parts -> Runtime.

    local   every part in this process (local.py)
    ray     placement groups and actor groups on a Ray cluster, or a local Ray (ray/cluster.py)

Which trainers and engine fleets each placement runs: miles_core/config/backends.py (refused at load
otherwise); each placement's own tables: local.ENGINE_FLEETS, ray/engines.ENGINE_SERVERS, and
training/backends.TRAINERS for both.
"""

from __future__ import annotations

from typing import Callable

from miles_core.config import TrainConfig

from .runtime import RunData, RunParts, Runtime


def _local(cfg: TrainConfig, data: RunData) -> RunParts:
    from .local import build_local

    return build_local(cfg, data)


def _ray(cfg: TrainConfig, data: RunData) -> RunParts:
    from .ray.cluster import build_ray  # ray loads only for runtime ray

    return build_ray(cfg, data)


PLACEMENTS: dict[str, Callable[[TrainConfig, RunData], RunParts]] = {"local": _local, "ray": _ray}


def load_run_data(cfg: TrainConfig) -> RunData:
    """Tokenizer, prompts (data source), eval suite, sampling and reward options: everything the driver keeps.
    Bad data or eval_config fails here, before any model loads."""
    from transformers import AutoTokenizer

    from miles_core.data import DataSource, load_prompts
    from miles_core.env import cache_dir
    from miles_core.evaluation import build_suite
    from miles_core.models import resolve_model_path
    from miles_core.specs import prompt_spec, resolve_data_path, reward_options, sampling_params

    model_path = resolve_model_path(cfg.checkpoint.hf_checkpoint, cache_dir())
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompts, dropped = load_prompts(resolve_data_path(cfg.data.prompt_data), tokenizer, prompt_spec(cfg))
    return RunData(model_path=model_path, tokenizer=tokenizer,
                   source=DataSource(prompts, shuffle=cfg.data.rollout_shuffle, seed=cfg.data.rollout_seed),
                   num_prompts=len(prompts), dropped_prompts=dropped, eval_suite=build_suite(cfg, tokenizer),
                   params=sampling_params(cfg, tokenizer.eos_token_id), rewards=reward_options(cfg))


def build_runtime(cfg: TrainConfig) -> Runtime:
    if cfg.cluster.num_threads:
        import torch

        torch.set_num_threads(cfg.cluster.num_threads)
    data = load_run_data(cfg)
    return Runtime(cfg, data, PLACEMENTS[cfg.cluster.runtime](cfg, data))

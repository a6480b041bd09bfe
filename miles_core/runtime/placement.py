"""Placements by ``runtime``, and ``build_runtime``: config -> data (driver side) -> parts -> Runtime.

    local   every part in this process (local.py)
    ray     placement groups and actor groups on a Ray cluster, or a local Ray (ray/cluster.py)

Which trainers and engine fleets each placement runs: miles_core/config/backends.py (refused at load
otherwise); each placement's own tables: local.ENGINE_FLEETS, ray/engines.ENGINE_SERVERS, and
training/backends.TRAINERS for both.
"""

from __future__ import annotations

import logging
from typing import Callable

from miles_core.config import TrainConfig

from .runtime import RunData, RunParts, Runtime

logger = logging.getLogger(__name__)


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

    from miles_core.data import load_prompts
    from miles_core.data.chat_template import with_chat_template
    from miles_core.env import cache_dir
    from miles_core.evaluation import build_suite
    from miles_core.models import resolve_model_path
    from miles_core.specs import context_len, prompt_spec, resolve_data_path, reward_options, sampling_params

    model_path = resolve_model_path(cfg.checkpoint.hf_checkpoint, cache_dir())
    tokenizer = with_chat_template(AutoTokenizer.from_pretrained(model_path), cfg.data.chat_template_path)
    context = context_len(cfg, model_path)
    spec = prompt_spec(cfg, context=context)
    if cfg.data.disable_rollout_global_dataset:  # the rollout function makes its prompts (custom_rollout.py)
        prompts, dropped = [], 0
    else:
        prompts, dropped = load_prompts(resolve_data_path(cfg.data.prompt_data), tokenizer, spec)
    if dropped:  # once per run, with the count (also the run's dropped_prompts param)
        logger.warning("dropped %d of %d prompts longer than %d tokens (%s)", dropped, dropped + len(prompts),
                       spec.max_prompt_len, spec.max_prompt_len_reason)
    return RunData(model_path=model_path, tokenizer=tokenizer, context_len=context, source=_data_source(cfg, prompts),
                   num_prompts=len(prompts), dropped_prompts=dropped, eval_suite=build_suite(cfg, tokenizer),
                   params=sampling_params(cfg, tokenizer.eos_token_id), rewards=reward_options(cfg))


def _data_source(cfg: TrainConfig, prompts: list):
    """The run's DataSource; buffer_filter_path resolved, with the config under the reference's names as its args."""
    from miles_core.data import DataSource
    from miles_core.resolve import reference_args, resolve
    from miles_core.rollout.multi_turn.spec import reference_args as flat_reference_args

    path = cfg.rollout.buffer_filter_path
    pick = None if path is None else resolve(path, what="buffer_filter_path")
    return DataSource(prompts, shuffle=cfg.data.rollout_shuffle, seed=cfg.data.rollout_seed, buffer_filter=pick,
                      filter_args=None if pick is None else reference_args(**flat_reference_args(cfg)))


def build_runtime(cfg: TrainConfig) -> Runtime:
    if cfg.cluster.num_threads:
        import torch

        torch.set_num_threads(cfg.cluster.num_threads)
    from miles_core.device import resolve_device
    from miles_core.malloc import retain_freed_memory

    if resolve_device(cfg.cluster.device).type == "cpu":
        retain_freed_memory()  # a CPU step's tensors reuse the last step's memory, not fresh pages (miles_core/malloc.py)
    from miles_core.checkpoint.budget import save_budget, warn_if_saves_exceed_free_space

    data = load_run_data(cfg)
    runtime = Runtime(cfg, data, PLACEMENTS[cfg.cluster.runtime](cfg, data))
    warn_if_saves_exceed_free_space(save_budget(data.model_path, cfg.save_dir, runtime.num_rollout, cfg.checkpoint), cfg.save_dir)
    return runtime

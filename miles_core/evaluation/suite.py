"""Build the EvalSuite of a run from its config and a tokenizer: datasets resolved by spec.py,
tokenized, with per-dataset sampling params and reward options; the eval function resolved from
``eval_function_path`` (a registry name first, else a dotted path)."""

from __future__ import annotations

from dataclasses import replace

from miles_core.config import TrainConfig
from miles_core.data import PromptSpec, load_prompts
from miles_core.rollout.http.wire import response_text
from miles_core.specs import prompt_spec, resolve_data_path, reward_options, sampling_params

from .core import EvalDataset, eval_params
from .point import EvalSuite, default_eval
from .spec import ResolvedDataset, resolve_datasets

EVAL_FUNCTIONS = {"default": default_eval}


def resolve_eval_fn(path: str | None):
    from miles_core.resolve import resolve

    return resolve(path or "default", EVAL_FUNCTIONS, "eval_function_path")


def build_suite(cfg: TrainConfig, tokenizer) -> EvalSuite:
    """-> the suite of ``cfg``'s eval datasets (empty when it has none)."""
    base_params = sampling_params(cfg, tokenizer.eos_token_id)
    base_reward = replace(reward_options(cfg), reward_key=cfg.rollout.eval_reward_key or cfg.rollout.reward_key)
    datasets = []
    for ds in resolve_datasets(cfg):
        prompts, _ = load_prompts(resolve_data_path(ds.path), tokenizer, _prompt_spec(cfg, ds))
        if ds.metadata_overrides:
            prompts = [replace(p, metadata={**p.metadata, **ds.metadata_overrides}) for p in prompts]
        params = eval_params(base_params, ds.temperature, ds.top_p, ds.top_k, ds.max_response_len, ds.stop, ds.stop_token_ids,
                             ds.min_new_tokens)
        reward = None if ds.rm_type == base_reward.rm_type else replace(base_reward, rm_type=ds.rm_type)
        datasets.append(EvalDataset(ds.name, tuple(prompts), ds.n_samples, params, reward, cfg.eval.eval_max_context_len,
                                    passrate=cfg.tracking.log_passrate))
    return EvalSuite(tuple(datasets), base_reward, base_reward.reward_key, cfg.misc.seed,
                     lambda ids: response_text(tokenizer, ids, base_params), resolve_eval_fn(cfg.eval.eval_function_path),
                     _eval_log(cfg))


def _eval_log(cfg: TrainConfig):
    """custom_eval_rollout_log_function_path as (rollout_id, data, extra_metrics) -> bool, the config bound as its args."""
    from miles_core.resolve import reference_args, resolve
    from miles_core.rollout.multi_turn.spec import reference_args as flat_reference_args

    path = cfg.rollout.custom_eval_rollout_log_function_path
    if path is None:
        return None
    fn, args = resolve(path, what="custom_eval_rollout_log_function_path"), reference_args(**flat_reference_args(cfg))
    return lambda rollout_id, data, extra: fn(rollout_id, args, data, extra)


def _prompt_spec(cfg: TrainConfig, ds: ResolvedDataset) -> PromptSpec:
    """The dataset's keys; its prompt length limit eval_max_prompt_len when set, else the rollout's (specs.prompt_limit)."""
    spec, limit = prompt_spec(cfg, keys=ds), cfg.eval.eval_max_prompt_len
    return spec if limit is None else replace(spec, max_prompt_len=limit, max_prompt_len_reason=f"eval_max_prompt_len {limit}")

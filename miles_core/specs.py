"""Config -> library objects: the data path, prompt spec, reward options and sampling params of a
run. Shared by the runtimes and the eval suite (which sit above data, rewards and rollout)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from miles_core.data import PromptSpec
from miles_core.data.tasks import materialize_builtin
from miles_core.env import cache_dir
from miles_core.rewards import RewardOptions
from miles_core.rollout.multi_turn.tools import load_tool_specs
from miles_core.rollout.protocol import SamplingParams

if TYPE_CHECKING:
    from miles_core.config import TrainConfig

DATA_PREFIX = "builtin://"


def resolve_data_path(spec: str) -> str:
    """builtin://<task>[@[a:b]] -> a jsonl in the cache; anything else unchanged."""
    if not spec.startswith(DATA_PREFIX):
        return spec
    name, at, sl = spec[len(DATA_PREFIX) :].partition("@")
    return str(materialize_builtin(name, cache_dir())) + at + sl


def context_len(cfg: TrainConfig, model_path: Path | None) -> int | None:
    """The effective context (prompt + response tokens): rollout_max_context_len, else the model's
    max_position_embeddings (config.json, or its text_config), else None (no limit known)."""
    if cfg.rollout.rollout_max_context_len is not None or model_path is None:
        return cfg.rollout.rollout_max_context_len
    path = Path(model_path) / "config.json"
    hf = json.loads(path.read_text()) if path.is_file() else {}
    return hf.get("max_position_embeddings") or (hf.get("text_config") or {}).get("max_position_embeddings")


def prompt_limit(cfg: TrainConfig, context: int | None) -> tuple[int | None, str]:
    """(the longest prompt kept, in tokens, and why): rollout_max_prompt_len when set (the reference's filter),
    else the effective context minus rollout_max_response_len, so a prompt and its response fit the model (when the
    response budget alone passes the context, the context less one token: generation is capped by the context)."""
    r = cfg.rollout
    if r.rollout_max_prompt_len is not None:
        return r.rollout_max_prompt_len, f"rollout_max_prompt_len {r.rollout_max_prompt_len}"
    if context is None:
        return None, "no limit"
    source = "rollout_max_context_len" if r.rollout_max_context_len is not None else "the model's max_position_embeddings"
    if context - r.rollout_max_response_len < 1:  # a response budget past the context: generation is capped by it
        return context - 1, f"the context {context} ({source}) less one token for the response"
    return context - r.rollout_max_response_len, (
        f"the context {context} ({source}) minus rollout_max_response_len {r.rollout_max_response_len}")


def prompt_spec(cfg: TrainConfig, keys=None, context: int | None = None) -> PromptSpec:
    """How prompts are read: the data group's keys, or those of ``keys`` (an eval dataset's input_key,
    label_key, metadata_key, tool_key); chat template and length limit (:func:`prompt_limit` of the effective
    ``context``) from the config either way."""
    d = cfg.data
    k = keys or d
    tools = tuple(load_tool_specs(cfg.rollout.generate_tool_specs_path)) if cfg.rollout.generate_tool_specs_path else None
    limit, why = prompt_limit(cfg, context)
    return PromptSpec(input_key=k.input_key, label_key=k.label_key, metadata_key=k.metadata_key, tool_key=k.tool_key,
                      apply_chat_template=d.apply_chat_template, apply_chat_template_kwargs=d.apply_chat_template_kwargs,
                      max_prompt_len=limit, max_prompt_len_reason=why, tools=tools)


def reward_options(cfg: TrainConfig) -> RewardOptions:
    r = cfg.rollout
    return RewardOptions(rm_type=r.rm_type, custom_rm_path=r.custom_rm_path, rm_url=r.rm_url, group_rm=r.group_rm,
                         reward_key=r.reward_key, custom_reward_post_process_path=r.custom_reward_post_process_path,
                         rm_timeout=r.rm_timeout, rm_max_retries=r.rm_max_retries)


def sampling_params(cfg: TrainConfig, eos_id: int) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(temperature=r.rollout_temperature, top_p=r.rollout_top_p, top_k=r.rollout_top_k,
                          max_new_tokens=r.rollout_max_response_len,
                          stop_token_ids=tuple(r.rollout_stop_token_ids or ()) + (eos_id,), stop=tuple(r.rollout_stop or ()),
                          skip_special_tokens=r.rollout_skip_special_tokens)

"""Config -> library objects: the data path, prompt spec, reward options and sampling params of a
run. Shared by the runtimes and the eval suite (which sit above data, rewards and rollout)."""

from __future__ import annotations

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


def prompt_spec(cfg: TrainConfig) -> PromptSpec:
    d = cfg.data
    tools = tuple(load_tool_specs(cfg.rollout.generate_tool_specs_path)) if cfg.rollout.generate_tool_specs_path else None
    return PromptSpec(d.input_key, d.label_key, d.metadata_key, d.tool_key, d.apply_chat_template,
                      d.apply_chat_template_kwargs, cfg.rollout.rollout_max_prompt_len, tools=tools)


def reward_options(cfg: TrainConfig) -> RewardOptions:
    r = cfg.rollout
    return RewardOptions(r.rm_type, r.custom_rm_path, r.rm_url, r.group_rm, r.reward_key,
                         r.custom_reward_post_process_path, r.rm_timeout, r.rm_max_retries)


def sampling_params(cfg: TrainConfig, eos_id: int) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(r.rollout_temperature, r.rollout_top_p, r.rollout_top_k, r.rollout_max_response_len,
                          tuple(r.rollout_stop_token_ids or ()) + (eos_id,), tuple(r.rollout_stop or ()))

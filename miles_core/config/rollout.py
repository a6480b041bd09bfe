"""Rollout generation and reward arguments (REFERENCE §1, §2, §4)."""

from __future__ import annotations

import os
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from ._base import Group

API_KEY_ENV = "MILES_ENGINE_API_KEY"  # the engines' API key (our server reads it too; external engines: the user sets it)


def engine_api_key() -> str | None:
    """The engines' API key from this process's environment (None: unset). Our server reads it at start; a run over
    rollout_external_engine_addrs sends it (the key those servers were started with)."""
    return os.environ.get(API_KEY_ENV) or None


def engine_url(addr: str) -> str:
    """An engine address as given (``host:port`` as in the reference, or ``http(s)://host:port``) -> its base URL.
    Raises ValueError naming the address."""
    parts = urlsplit(addr if "://" in addr else f"http://{addr}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ValueError(f"{addr!r} is not an engine address: expected host:port or http://host:port")
    return f"{parts.scheme}://{parts.netloc}"


class RolloutConfig(Group):
    """Rollout generation and rewards: how many rollouts, prompts and samples, sampling and the reward model."""

    form_first = ("num_rollout", "rollout_batch_size", "n_samples_per_prompt")

    rollout_batch_size: int = Field(..., ge=1, description="Prompts per rollout (required).")
    n_samples_per_prompt: int = Field(1, ge=1, description="Responses sampled per prompt (the group size G).")
    num_rollout: int | None = Field(None, ge=1, description="Rollouts to run; default len(dataset) // rollout_batch_size * num_epoch.")
    rollout_temperature: float = Field(1.0, gt=0, description="Sampling temperature; logits are divided by it before log-softmax, in training too.")
    rollout_top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold.")
    rollout_top_k: int = Field(-1, description="Top-k sampling (-1 = off).")
    rollout_max_response_len: int = Field(1024, ge=1, description="Maximum new tokens per response.")
    rollout_max_context_len: int | None = Field(None, ge=1, description="Maximum prompt + response tokens; max_new_tokens = min(response len, context len - prompt len).")
    rollout_max_prompt_len: int | None = Field(None, ge=1, description="Prompts longer than this (in tokens) are dropped and counted.")
    rollout_stop: list[str] | None = Field(None, description="Stop strings.")
    rollout_skip_special_tokens: bool = Field(
        False, description="Decode responses (rollout and eval) with the tokenizer's special tokens skipped; off (the "
        "reference's default): they stay in the text. Either way the stop token that ended a response is trimmed, as "
        "SGLang does; it is sent to SGLang engines as sampling_params.skip_special_tokens. The trained token ids never change.")
    rollout_stop_token_ids: list[int] | None = Field(None, description="Stop token ids (the tokenizer's EOS is always one).")
    over_sampling_batch_size: int | None = Field(None, ge=1, description="Groups to sample per round with dynamic sampling (>= rollout_batch_size).")
    dynamic_sampling_filter_path: str | None = Field(None, description="Dotted path of a group filter (dynamic sampling).")
    partial_rollout: bool = Field(False, description="Keep the groups of the last over-sampled round that were not used in a buffer (saved with checkpoints) that the next rollout takes first, instead of dropping them; aborted samples are continued.")
    buffer_filter_path: str | None = Field(
        None, description="partial_rollout: dotted path of fn(args, rollout_id, buffer, num_samples) -> groups, the "
                          "reference's, picking the buffered groups a round takes (default: the oldest first); it removes "
                          "them from buffer (a list of groups of Samples); rollout_id is None, as in the reference.")
    mask_offpolicy_in_partial_rollout: bool = Field(
        False, description="partial_rollout: the tokens a buffered sample was generated with before (by older weights) get "
                           "loss mask 0 when a later rollout takes it (a finished one is then not trained on at all); only "
                           "the tokens generated on top are trained, as the reference's generate_and_rm.")
    async_mode: Literal["off", "one_step", "fully"] = Field(
        "off", description="Overlap generation with training: off (generate, then train), one_step (generate rollout i+1 while "
        "training on i; the reference's train_async), fully (a background worker keeps a bounded buffer of scored groups).")
    update_weights_interval: int = Field(1, ge=1, description="async_mode one_step / fully: sync weights to the engines after every n-th rollout.")
    max_weight_staleness: int | None = Field(
        None, ge=0, description="async_mode fully: a group generated more than this many weight syncs ago is not trained on (see stale_group_policy); None = no bound.")
    stale_group_policy: Literal["recycle", "drop"] | None = Field(
        None, description="async_mode fully: a group over max_weight_staleness has its prompt regenerated (recycle) or is "
                          "dropped (drop); default: async_unused_samples_handler's choice.")
    async_unused_samples_handler: Literal["retry", "drop"] = Field(
        "drop", description="async_mode fully: what happens to a group not trained on for being over max_weight_staleness, "
                            "as the reference's: drop (discarded with its prompt) or retry (its prompt regenerated with "
                            "fresh weights, stale_group_policy recycle); stale_group_policy, when set, instead.")
    pause_generation_mode: Literal["abort", "retract", "in_place"] = Field(
        "retract", description="How each engine pauses for a weight sync (SGLang's /pause_generation mode): abort (requests in "
        "flight end with finish reason abort), retract (they go back to the queue and continue after the sync), in_place "
        "(they freeze and resume with their KV cache; the sync then skips /flush_cache). Our own loop holds its generation "
        "out of a sync, so it matters for requests others send to the engines.")
    fully_async_buffer_groups: int | None = Field(
        None, ge=1, description="async_mode fully: most scored groups held in the buffer (default async_data_buffer_capacity_factor "
                                "* rollout_batch_size); the worker waits when full.")
    async_data_buffer_capacity_factor: float = Field(
        2.0, gt=0, description="async_mode fully: the buffer holds at most int(this * rollout_batch_size) scored groups (at "
                               "least 1), as the reference's DefaultDataBuffer; fully_async_buffer_groups, when set, instead.")
    async_max_concurrent_samples: int | None = Field(
        None, ge=1, description="async_mode fully: samples the worker generates at once, in whole groups: max(1, this // "
                                "n_samples_per_prompt) groups per round (default over_sampling_batch_size, else "
                                "rollout_batch_size), as the reference's FullyAsyncRolloutFn.")
    custom_generate_function_path: str | None = Field(
        None, description="Who generates a response: multi_turn (the built-in tool-calling loop), or the dotted path of an async "
        "function, the reference's (args, sample, sampling_params) -> Sample or ours (ctx, sample) -> Sample "
        "(docs/guide/multi-turn.md); resolved when the config loads.")
    generate_max_turns: int = Field(16, ge=1, description="custom_generate_function_path multi_turn: most model turns per sample.")
    generate_tool_specs_path: str | None = Field(
        None, description="Tools passed to the chat template: a .json file or the dotted path of a list of OpenAI-style tool specs.")
    generate_tool_call_parser: str | None = Field(
        None, description="Tool-call format of the model's turns: qwen25 (qwen, hermes: <tool_call>{json}</tool_call>) or glm45 (glm4).")
    generate_execute_tool_function_path: str | None = Field(
        None, description="Dotted path of the tool runner fn(name, arguments) -> str, sync or async.")
    generate_tool_timeout: float = Field(
        30.0, gt=0, description="Seconds one tool call may run; past it the call fails (reason timeout) and the sample's reward is 0.")
    rollout_external: bool = Field(
        False, description="Use engines already running elsewhere instead of launching them (the reference's switch): their "
        "addresses are rollout_external_engine_addrs, which it needs (the addresses alone select them too).")
    rollout_external_engine_addrs: list[str] | None = Field(
        None, min_length=1, description="Engines already running, as host:port (or http://host:port): any server speaking the "
        "SGLang HTTP protocol (SGLang's, or ours: python -m miles_core.rollout.http.server). Nothing is launched: the router "
        "sends work to these, weight syncs update them (update_weight_mode tensor for our servers, broadcast: a process group "
        "they join at the sender's address, disk for SGLang's: a directory they can read), on either runtime (ray places the "
        f"train ranks only), and their API key is read from {API_KEY_ENV} in the run's environment. An engine "
        "failing its health checks (use_fault_tolerance) is marked dead, never restarted (docs/engines.md).")
    rm_type: str = Field("math", description="Reward function name (see the rewards page); a boxed_ prefix grades the last \\boxed{} only.")
    custom_rm_path: str | None = Field(None, description="Dotted path of an async reward function; overrides rm_type.")
    rm_url: str | None = Field(None, description="URL of a remote reward model (rm_type remote_rm).")
    group_rm: bool = Field(False, description="Score a whole group in one call of custom_rm_path.")
    reward_key: str | None = Field(None, description="Field of a dict reward used as the scalar reward.")
    eval_reward_key: str | None = Field(None, description="Field of a dict reward used in evaluation (default reward_key).")
    custom_reward_post_process_path: str | None = Field(None, description="Dotted path of a function (samples, rewards) -> rewards.")
    rollout_data_postprocess_path: str | None = Field(
        None, description="Dotted path of a function (args, rollout_data) the trainer calls after the advantages, before the "
        "optimizer steps, on the reference's per-sample dict (loss_masks, advantages, returns, log_probs, ...); what it "
        "changes in place trains (training/rollout_data.py).")
    custom_rollout_log_function_path: str | None = Field(
        None, description="Dotted path of fn(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> bool, the "
                          "reference's signature (args: the config under the reference's names), called after each "
                          "rollout is generated and scored; True: the rollout's generation metrics (rollout/* of the "
                          "samples, passrate/*, perf/rollout_time and throughputs) are not logged.")
    rollout_sample_filter_path: str | None = Field(
        None, description="Dotted path of fn(args, data) -> None, the reference's: called with each rollout's groups "
                          "(list[list[Sample]]) once generated and scored; a sample it marks sample.remove_sample = True "
                          "gets loss mask 0 (still in the group's advantage normalization and the rollout metrics).")
    rollout_function_path: str | None = Field(
        None, description="Dotted path of the reference's whole-rollout function fn(args, rollout_id, data_source, evaluation=False) "
                          "-> list[list[Sample]] or RolloutFnTrainOutput (or a class built with RolloutFnConstructorInput and "
                          "called with RolloutFnTrainInput): it replaces miles' generate loop; data_source.get_samples(n) hands "
                          "out groups of the run's prompts, args.sglang_router_ip / port is an SGLang /generate endpoint over "
                          "the run's engines; it returns rollout_batch_size groups of n_samples_per_prompt finished samples "
                          "(docs/guide/customization.md).")
    rollout_all_samples_process_path: str | None = Field(
        None, description="Dotted path of fn(args, all_samples, data_source), the reference's: called after each rollout of miles' "
                          "generate loop with every group dynamic sampling examined (kept and dropped, in group order) and the "
                          "run's data source (data_source.add_samples(groups) hands groups to the next rollout).")
    custom_eval_rollout_log_function_path: str | None = Field(
        None, description="Dotted path of fn(rollout_id, args, data, extra_metrics) -> bool, the reference's signature, called "
                          "after each eval's datasets are generated and scored (data: {dataset: {rewards, truncated, samples}}, "
                          "extra_metrics None; rollout_id: the last rollout trained, 0 before training); True: the eval's "
                          "dataset metrics (eval/<ds>...) are not logged.")
    rm_timeout: float = Field(30.0, gt=0, description="Seconds per remote reward request.")
    rm_max_retries: int = Field(3, ge=0, description="Retries of a failed remote reward request.")

    @property
    def external_engines(self) -> bool:
        """Engines already running elsewhere, nothing launched: rollout_external (which needs the addresses; rules.py) or
        the addresses alone."""
        return self.rollout_external or self.rollout_external_engine_addrs is not None

    @field_validator("rollout_external_engine_addrs")
    @classmethod
    def _engine_addresses(cls, value: list[str] | None) -> list[str] | None:
        urls = [engine_url(a) for a in value or []]
        if len(set(urls)) != len(urls):
            raise ValueError(f"an engine address is listed twice: {value}")
        return value

"""The built-in multi-turn generate (``custom_generate_function_path: multi_turn``).

Every unfinished sample of a round advances in lockstep, one model turn per engine call (so a
turn of all samples is one batched, seeded request list, and a rerun gives the same ids):

1. model turn: the request is the sample's ids so far; ``max_new_tokens`` is what the sample's
   response budget leaves (min(rollout_max_response_len, rollout_max_context_len - prompt length),
   counted over model and tool tokens). The sampled ids are appended with loss_mask 1 and their
   log-probs; the engine's weight version is appended to ``weight_versions`` (one per turn).
2. finish reason length -> TRUNCATED, abort -> ABORTED (with ``partial_rollout`` the next round
   continues the same turn); stop -> the turn's text (decoded from its ids) is parsed
   (``generate_tool_call_parser``). No call -> COMPLETED.
3. the calls run concurrently (``generate_execute_tool_function_path``, ``generate_tool_timeout``
   each); their outputs become tool messages, rendered by the chat template and appended with
   loss_mask 0 and rollout log-prob 0 (data/chat_template.py). A failed call (error, timeout, non-text)
   ends the conversation: ``metadata["tool_failure"]`` holds the reason and the sample's reward
   is set to 0 after scoring (``zero_failed_rewards``). Tool ids that do not fit the budget are
   cut and the sample is TRUNCATED.
4. repeat until no call, ``generate_max_turns`` model turns (COMPLETED), or the budget.

Per-sample metadata: ``round_number`` (model turns), ``tool_calls`` (calls run),
``turn_start`` (response index where the current model turn began), ``tool_failure``,
``tool_call_malformed``, ``tool_call_incomplete`` (counts), read by metrics.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Callable

from miles_core.data.sample import FINISH_STATUS, Sample, Status

from ..protocol import GenerateRequest
from .parsers import ParsedTurn, get_parser
from miles_core.data.chat_template import tool_message_ids, with_chat_template
from .tools import ToolResult, load_execute_function, load_tool_specs, run_tool



@dataclass(frozen=True)
class TurnSpec:
    """The multi-turn part of a RolloutSpec (hashable; the live objects are built from it once, ``tools_of``)."""

    generate_function: str  # custom_generate_function_path: "multi_turn" or a user function
    tokenizer_path: str
    max_turns: int = 16
    tool_call_parser: str | None = None
    tool_specs_path: str | None = None
    execute_tool_path: str | None = None
    tool_timeout: float = 30.0
    args_json: str = "{}"  # the run's config under the reference's flag names (a custom function's ``args``)
    chat_template_path: str | None = None  # the run's chat template file instead of the tokenizer's own


@dataclass(frozen=True)
class Toolbox:
    tokenizer: Any
    parse: Callable[[str], ParsedTurn] | None
    specs: list[dict] | None
    execute: Callable[..., Any] | None


@lru_cache(maxsize=4)
def tools_of(spec: TurnSpec) -> Toolbox:
    from transformers import AutoTokenizer

    return Toolbox(
        tokenizer=with_chat_template(AutoTokenizer.from_pretrained(spec.tokenizer_path), spec.chat_template_path),
        parse=get_parser(spec.tool_call_parser) if spec.tool_call_parser else None,
        specs=load_tool_specs(spec.tool_specs_path) if spec.tool_specs_path else None,
        execute=load_execute_function(spec.execute_tool_path) if spec.execute_tool_path else None,
    )


def _append(s: Sample, ids: list[int], log_probs: list[float], trainable: bool) -> None:
    s.tokens = s.tokens + ids
    s.response_length += len(ids)
    s.loss_mask = s.loss_mask + [int(trainable)] * len(ids)
    s.rollout_log_probs = s.rollout_log_probs + list(log_probs)


def _count(s: Sample, key: str, n: int = 1) -> None:
    s.metadata[key] = s.metadata.get(key, 0) + n


def run_turns(engine, todo: list[tuple[Sample, int]], spec, seed: int, decode: Callable[[list[int]], str]) -> None:
    """Advance every (sample, tokens left) of ``todo`` to the end of its conversation (or an abort)."""
    box = tools_of(spec.turns)
    budget = {id(s): s.response_length + left for s, left in todo}
    active = [s for s, _ in todo]
    for s in active:
        if s.status == Status.PENDING:
            s.metadata.update(round_number=0, tool_calls=0, turn_start=0)
    for turn in range(spec.turns.max_turns):
        reqs = [GenerateRequest(list(s.tokens), replace(spec.params, max_new_tokens=budget[id(s)] - s.response_length,
                                                        min_new_tokens=min(spec.params.min_new_tokens, budget[id(s)] - s.response_length)))
                for s in active]
        results = engine.generate(reqs, seed=(seed * 31 + turn) % 2**31)
        calling: list[tuple[Sample, ParsedTurn, int | None]] = []
        for s, res in zip(active, results):
            _append(s, res.output_ids, res.output_log_probs, trainable=True)
            s.weight_versions = s.weight_versions + [res.weight_version]
            s.status = FINISH_STATUS[res.finish_reason]
            if s.status != Status.ABORTED:
                _count(s, "round_number")
            if s.status != Status.COMPLETED or box.parse is None:
                continue
            parsed = box.parse(decode(s.response_tokens[s.metadata["turn_start"]:]))
            _count(s, "tool_call_malformed", len(parsed.malformed))
            _count(s, "tool_call_incomplete", int(parsed.incomplete))
            if parsed.calls and s.metadata["round_number"] < spec.turns.max_turns:
                calling.append((s, parsed, res.output_ids[-1] if res.output_ids else None))
        _run_calls(calling, box, spec.turns.tool_timeout, budget)
        active = [s for s, _, _ in calling if s.status == Status.PENDING]
        if not active:  # a call is never run after the max_turns-th model turn, so this ends the loop in time
            break


def _run_calls(calling: list[tuple[Sample, ParsedTurn, int | None]], box: Toolbox, timeout: float, budget: dict) -> None:
    """Run every call of every calling sample concurrently; append the tool ids or record the failure."""
    if not calling:
        return
    if box.execute is None:
        raise ValueError("the model called a tool but generate_execute_tool_function_path is not set")

    async def all_calls() -> list[list[ToolResult]]:
        return await asyncio.gather(*(asyncio.gather(*(run_tool(box.execute, c, timeout) for c in p.calls)) for _, p, _ in calling))

    for (s, _, stopped_with), results in zip(calling, asyncio.run(all_calls())):
        failed = next((r for r in results if r.failure), None)
        _count(s, "tool_calls", len(results))
        if failed is not None:
            s.metadata["tool_failure"], s.metadata["tool_failure_message"] = failed.failure, failed.message
            continue
        messages = [{"role": "tool", "name": r.call.name, "content": r.content} for r in results]
        ids = tool_message_ids(box.tokenizer, messages, stopped_with)
        room = budget[id(s)] - s.response_length
        _append(s, ids[:room], [0.0] * min(len(ids), room), trainable=False)
        if len(ids) >= room:
            s.status = Status.TRUNCATED
            continue
        s.status = Status.PENDING
        s.metadata["turn_start"] = s.response_length


def zero_failed_rewards(samples: list[Sample], reward_key: str | None) -> None:
    """A sample whose tool failed gets reward 0 (the dict field ``reward_key`` for dict rewards)."""
    for s in samples:
        if "tool_failure" in s.metadata:
            s.reward = {**s.reward, reward_key: 0.0} if isinstance(s.reward, dict) else 0.0

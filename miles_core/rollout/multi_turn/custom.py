"""``custom_generate_function_path``: who generates a sample's response.

Three kinds, told apart when the config loads (``resolve_generate_function``: a typo, a missing
module or a wrong signature fails then, before any model loads):

- ``multi_turn`` (also the reference's ``miles.rollout.generate_hub.multi_turn.generate``): the
  built-in tool-calling loop (loop.py).
- the reference's signature, ``async def generate(args, sample, sampling_params) -> Sample``
  (optionally an ``evaluation`` keyword): ``args`` is an ``argparse.Namespace`` of the run's config
  under the reference's flag names plus ``sglang_router_ip`` / ``sglang_router_port``, an SGLang
  ``POST /generate`` endpoint over this run's engines (``GenerateFront``, 127.0.0.1, for the round);
  ``sampling_params`` is the SGLang dict of the rollout's sampling parameters, ``max_new_tokens``
  = what the sample's budget leaves, with a ``sampling_seed`` of the sample (pass it on to get
  reproducible rollouts).
- ours, ``async def generate(ctx: GenerateContext, sample: Sample) -> Sample``: ``await
  ctx.generate(input_ids)`` calls the engines in process (batched with the other samples' calls,
  seeded per sample and call), ``ctx.tokenizer``, ``ctx.params``, ``ctx.budget``, ``ctx.args``.

A function returns the sample (the one it got, changed, or a new one) with tokens = prompt +
response, ``response_length``, ``loss_mask`` and ``rollout_log_probs`` of length response_length
and a status other than pending; ``weight_versions`` left empty is filled with the engine's
version. A list of samples (the reference's multi-sample output) is refused unless it has one
sample: the trainer takes rollout_batch_size * n_samples_per_prompt samples per rollout.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from miles_core.data.sample import Sample, Status
from miles_core.resolve import resolve

from ..protocol import GenerateRequest, GenerateResult, SamplingParams
from .calls import EngineCalls

BUILTIN_NAMES = frozenset({"multi_turn", "miles.rollout.generate_hub.multi_turn.generate"})


@dataclass(frozen=True)
class GenerateFunction:
    path: str
    style: str  # "builtin" | "reference" | "miles"
    fn: Callable[..., Any] | None = None
    wants_evaluation: bool = False


def resolve_generate_function(path: str) -> GenerateFunction:
    """custom_generate_function_path -> its kind and function; ValueError naming the path otherwise."""
    if path in BUILTIN_NAMES:
        return GenerateFunction(path=path, style="builtin")
    fn = resolve(path, what="custom_generate_function_path")
    if not inspect.iscoroutinefunction(fn):
        raise ValueError(f"custom_generate_function_path {path!r} must be an async function (async def)")
    params = inspect.signature(fn).parameters
    required = [p for p in params.values() if p.default is p.empty and p.kind <= p.POSITIONAL_OR_KEYWORD]
    if len(required) == 3:
        return GenerateFunction(path=path, style="reference", fn=fn, wants_evaluation="evaluation" in params)
    if len(required) == 2:
        return GenerateFunction(path=path, style="miles", fn=fn)
    raise ValueError(f"custom_generate_function_path {path!r}: expected (args, sample, sampling_params) (the reference's) "
                     f"or (ctx, sample) (ours), got {len(required)} required parameters")


@dataclass
class GenerateContext:
    """What our own custom generate function gets besides the sample."""

    calls: EngineCalls = field(repr=False)
    tokenizer: Any
    params: SamplingParams
    budget: int  # response tokens this sample may still add (model and inserted tokens)
    seed: int
    args: argparse.Namespace
    n_calls: int = 0

    async def generate(self, input_ids: list[int], max_new_tokens: int | None = None) -> GenerateResult:
        """One engine call: sampled ids, their log-probs, finish reason, weight version."""
        from miles_core.rollout.hf_engine import request_seed

        n = self.params.max_new_tokens if max_new_tokens is None else max_new_tokens
        self.n_calls += 1
        request = GenerateRequest(list(input_ids), replace(self.params, max_new_tokens=n))
        return await self.calls.generate(request, request_seed(self.seed, self.n_calls))


def sglang_params(params: SamplingParams, max_new_tokens: int, seed: int) -> dict[str, Any]:
    return {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k, "max_new_tokens": max_new_tokens,
            "stop": list(params.stop), "stop_token_ids": list(params.stop_token_ids), "sampling_seed": seed}


def _checked(fn: GenerateFunction, out: Any, version: int) -> Sample:
    if isinstance(out, list):
        if len(out) != 1:
            raise ValueError(f"custom generate function {fn.path!r} returned {len(out)} samples for one sample; multi-sample "
                             "output is not supported yet (the trainer takes rollout_batch_size * n_samples_per_prompt samples)")
        out = out[0]
    if not isinstance(out, Sample):
        raise ValueError(f"custom generate function {fn.path!r} returned {type(out).__name__}, expected a Sample")
    n = out.response_length
    for name in ("loss_mask", "rollout_log_probs"):
        if len(getattr(out, name)) != n:
            raise ValueError(f"custom generate function {fn.path!r}: sample {out.index} has {len(getattr(out, name))} "
                             f"{name} values, expected response_length={n}")
    if out.status == Status.PENDING or not 0 <= n <= len(out.tokens):
        raise ValueError(f"custom generate function {fn.path!r}: sample {out.index} came back with status {out.status.value} "
                         f"and response_length {n} of {len(out.tokens)} tokens; set the status and the response fields")
    if not out.weight_versions:
        out.weight_versions = [version]
    return out


def run_custom(fn: GenerateFunction, engine, todo: list[tuple[Sample, int]], spec, seed: int) -> list[Sample]:
    """Run the user's function on every (sample, tokens left); -> the returned samples, in order."""
    from miles_core.rollout.hf_engine import request_seed

    from .front import GenerateFront
    from .loop import tools_of

    tokenizer = tools_of(spec.turns).tokenizer
    args = argparse.Namespace(**json.loads(spec.turns.args_json))
    version = engine.get_weight_version()
    seeds = [request_seed(seed, s.index) for s, _ in todo]

    async def run_all(front) -> list[Any]:
        if fn.style == "reference":
            args.sglang_router_ip, args.sglang_router_port = front.host, front.port
            extra = {"evaluation": False} if fn.wants_evaluation else {}
            coros = [fn.fn(args, s, sglang_params(spec.params, left, sd), **extra) for (s, left), sd in zip(todo, seeds)]
        else:
            calls = EngineCalls(engine)
            coros = [fn.fn(GenerateContext(calls=calls, tokenizer=tokenizer, params=spec.params, budget=left, seed=sd, args=args), s)
                     for (s, left), sd in zip(todo, seeds)]
        return await asyncio.gather(*coros)

    if fn.style == "reference":
        with GenerateFront(engine, tokenizer) as front:
            outs = asyncio.run(run_all(front))
    else:
        outs = asyncio.run(run_all(None))
    return [_checked(fn, out, version) for out in outs]

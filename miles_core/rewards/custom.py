"""Extension points: custom_rm_path, group_rm and custom_reward_post_process_path.

Signatures (all functions may be ``async def`` or plain ``def``; plain ones run in a thread). Each accepts
our form or the reference system's form, told apart by the first parameter's name (``args``: the reference's):
- ``custom_rm_path`` -> ``f(sample) -> float | dict`` (reference: ``f(args, sample, **kwargs)``): called once
  per sample (write ``async def f(sample, **kwargs)`` to stay forward-compatible).
- with ``group_rm`` -> ``f(samples) -> list[float | dict]`` (reference: ``f(args, samples, **kwargs)``):
  called once per group (samples sharing ``group_index``, in input order), returns one reward per sample.
- ``custom_reward_post_process_path`` -> ``f(samples, rewards) -> rewards``: called once per
  ``batched_async_rm`` call with all samples and their raw rewards, returns the same number. Reference:
  ``f(args, samples) -> (raw_rewards, rewards)`` with each ``sample.reward`` holding its raw reward; its
  raw_rewards become ``metadata["raw_reward"]`` (rollout/raw_reward).
``args`` is a namespace of the reward options (rm_type, custom_rm_path, rm_url, group_rm, reward_key, ...,
the reference's flag names). A reward is a number (returned as float; bool is accepted) or a dict; anything
else is a ``TypeError`` naming the function path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from miles_core.data.sample import Sample
from miles_core.resolve import reference_args, takes_reference_args
from miles_core.resolve import resolve as load_function
from miles_core.rewards.options import RewardOptions

Reward = float | dict[str, Any]


async def call(fn: Callable[..., Any], *args: Any) -> Any:
    """Await ``fn(*args)``: coroutine functions directly, plain functions in a worker thread."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    result = await asyncio.to_thread(fn, *args)
    return await result if inspect.isawaitable(result) else result


def check_reward(value: Any, path: str) -> Reward:
    """``value`` as a reward (number -> float, dict as is) or TypeError naming ``path``."""
    if isinstance(value, dict):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    raise TypeError(f"reward function {path!r} returned {type(value).__name__} {value!r}; "
                    "expected a number or a dict")


def check_rewards(values: Any, n: int, path: str) -> list[Reward]:
    """A list of ``n`` rewards, or TypeError/ValueError naming ``path``."""
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"reward function {path!r} returned {type(values).__name__}; expected a list of {n}")
    if len(values) != n:
        raise ValueError(f"reward function {path!r} returned {len(values)} rewards for {n} samples")
    return [check_reward(v, path) for v in values]


def options_args(opts: RewardOptions):
    """The ``args`` a reference-style reward function receives: the reward options by their flag names."""
    return reference_args(**{f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)})


def _with_args(fn: Callable[..., Any], opts: RewardOptions, *args: Any) -> tuple[Any, ...]:
    """The positional arguments of ``fn``: the reference's ``args`` first when it is written that way."""
    return (options_args(opts), *args) if takes_reference_args(fn) else args


async def custom_reward(path: str, sample: Sample, opts: RewardOptions) -> Reward:
    """One sample scored by the ``custom_rm_path`` function."""
    fn = load_function(path)
    return check_reward(await call(fn, *_with_args(fn, opts, sample)), path)


async def group_rewards(path: str, samples: list[Sample], opts: RewardOptions) -> list[Reward]:
    """Every sample scored by one group-function call per ``group_index`` (input order kept)."""
    fn = load_function(path)
    groups: dict[int, list[int]] = {}
    for pos, sample in enumerate(samples):
        groups.setdefault(sample.group_index, []).append(pos)
    results = await asyncio.gather(*(call(fn, *_with_args(fn, opts, [samples[p] for p in pos])) for pos in groups.values()))
    rewards: list[Reward] = [0.0] * len(samples)
    for positions, values in zip(groups.values(), results):
        for pos, reward in zip(positions, check_rewards(values, len(positions), path)):
            rewards[pos] = reward
    return rewards


async def post_process(path: str, samples: list[Sample], rewards: list[Reward], opts: RewardOptions) -> list[Reward]:
    """The rewards returned by the ``custom_reward_post_process_path`` function (module docstring)."""
    fn = load_function(path)
    if not takes_reference_args(fn):
        return check_rewards(await call(fn, samples, rewards), len(samples), path)
    for sample, raw in zip(samples, rewards):
        sample.reward = raw
    result = await call(fn, options_args(opts), samples)
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise TypeError(f"reward post-process function {path!r} (reference form f(args, samples)) returned "
                        f"{type(result).__name__}; expected (raw_rewards, rewards)")
    raw, processed = (check_rewards(r, len(samples), path) for r in result)
    for sample, value in zip(samples, raw):
        sample.metadata["raw_reward"] = float(value) if not isinstance(value, dict) else value
    return processed

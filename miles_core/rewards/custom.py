"""Extension points: custom_rm_path, group_rm and custom_reward_post_process_path.

Signatures (all functions may be ``async def`` or plain ``def``; plain ones run in a thread):
- ``custom_rm_path`` -> ``f(sample: Sample) -> float | dict``: called with one positional
  argument per sample (write it as ``async def f(sample, **kwargs)`` to stay forward-compatible).
- with ``group_rm`` -> ``f(samples: list[Sample]) -> list[float | dict]``: called once per group
  (samples sharing ``group_index``, in input order), returns one reward per sample.
- ``custom_reward_post_process_path`` -> ``f(samples, rewards) -> rewards``: called once per
  ``batched_async_rm`` call with all samples and their raw rewards, returns the same number.
A reward is a number (returned as float; bool is accepted) or a dict; anything else is a
``TypeError`` naming the function path.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from miles_core.data.sample import Sample
from miles_core.resolve import resolve as load_function

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


async def custom_reward(path: str, sample: Sample) -> Reward:
    """One sample scored by the ``custom_rm_path`` function."""
    return check_reward(await call(load_function(path), sample), path)


async def group_rewards(path: str, samples: list[Sample]) -> list[Reward]:
    """Every sample scored by one group-function call per ``group_index`` (input order kept)."""
    fn = load_function(path)
    groups: dict[int, list[int]] = {}
    for pos, sample in enumerate(samples):
        groups.setdefault(sample.group_index, []).append(pos)
    results = await asyncio.gather(*(call(fn, [samples[p] for p in pos]) for pos in groups.values()))
    rewards: list[Reward] = [0.0] * len(samples)
    for positions, values in zip(groups.values(), results):
        for pos, reward in zip(positions, check_rewards(values, len(positions), path)):
            rewards[pos] = reward
    return rewards


async def post_process(path: str, samples: list[Sample], rewards: list[Reward]) -> list[Reward]:
    """The rewards returned by the ``custom_reward_post_process_path`` function."""
    result = await call(load_function(path), samples, rewards)
    return check_rewards(result, len(samples), path)

"""The rm_type name table: one entry per reward family, keyed by the config value.

Every family has the same interface: ``score(sample, opts)`` (synchronous) and
``ascore(sample, opts)`` (never blocks the event loop). Local graders are pure functions
``(sample) -> float | dict`` run in a worker thread when awaited; ``remote_rm`` does HTTP.
A ``boxed_`` prefix on any name first replaces the response with the content of its last
``\\boxed{...}`` (``""`` if none), then dispatches on the rest of the name.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from miles_core.data.sample import Sample
from miles_core.rewards._text import last_boxed
from miles_core.rewards.dapo import dapo_reward
from miles_core.rewards.deepscaler import deepscaler_reward
from miles_core.rewards.f1 import f1_reward
from miles_core.rewards.gemma_math import gemma_math_reward
from miles_core.rewards.gpqa import gpqa_reward
from miles_core.rewards.math_rm import math_reward
from miles_core.rewards.random_rm import deterministic_random_reward, random_reward
from miles_core.rewards.remote_rm import remote_reward
from miles_core.rewards.sympy_pool import DEFAULT_POOL_SIZE

if TYPE_CHECKING:
    from miles_core.rewards.options import RewardOptions

Reward = float | dict[str, Any]
BOXED_PREFIX = "boxed_"


@dataclasses.dataclass(frozen=True)
class LocalFamily:
    """A CPU-bound pure grader; awaited through a worker thread."""

    grade: Callable[[Sample], Reward]

    def score(self, sample: Sample, opts: "RewardOptions") -> Reward:
        return self.grade(sample)

    async def ascore(self, sample: Sample, opts: "RewardOptions") -> Reward:
        return await asyncio.to_thread(self.grade, sample)


@dataclasses.dataclass(frozen=True)
class RemoteFamily:
    """An I/O-bound grader (an HTTP service); the sync form runs its own event loop."""

    grade: Callable[[Sample, "RewardOptions"], Any]

    def score(self, sample: Sample, opts: "RewardOptions") -> Reward:
        return asyncio.run(self.grade(sample, opts))

    async def ascore(self, sample: Sample, opts: "RewardOptions") -> Reward:
        return await self.grade(sample, opts)


async def grade_local_batch(jobs: list[tuple[LocalFamily, Sample]], threads: int = DEFAULT_POOL_SIZE) -> list[Reward]:
    """The rewards of ``jobs`` (family, sample), in order, graded off the event loop.

    At most ``threads`` worker threads (default: one per sympy worker, so that slow sympy comparisons
    still run side by side), each taking the next job until none is left: a few thread hand-offs per
    batch instead of one per sample. The time limit stays per comparison (inside the graders).
    """
    results: list[Reward | None] = [None] * len(jobs)
    todo = collections.deque(enumerate(jobs))  # popleft is atomic: the threads share it without a lock

    def drain() -> None:
        while True:
            try:
                i, (family, sample) = todo.popleft()
            except IndexError:
                return
            results[i] = family.grade(sample)

    await asyncio.gather(*(asyncio.to_thread(drain) for _ in range(min(threads, len(jobs)))))
    return results


FAMILIES: dict[str, LocalFamily | RemoteFamily] = {
    "math": LocalFamily(math_reward),
    "deepscaler": LocalFamily(deepscaler_reward),
    "gemma_math": LocalFamily(gemma_math_reward),
    "dapo": LocalFamily(dapo_reward),
    "f1": LocalFamily(f1_reward),
    "gpqa": LocalFamily(gpqa_reward),
    "random": LocalFamily(random_reward),
    "deterministic_random": LocalFamily(deterministic_random_reward),
    "remote_rm": RemoteFamily(remote_reward),
}
RM_TYPES: tuple[str, ...] = tuple(FAMILIES)


def base_rm_type(name: str) -> tuple[bool, str]:
    """``(boxed, base)`` for ``name``: ``"boxed_f1"`` -> ``(True, "f1")``; no validation."""
    if isinstance(name, str) and name.startswith(BOXED_PREFIX):
        return True, name[len(BOXED_PREFIX) :]
    return False, name


def validate_rm_type(name: str) -> None:
    """Raise ValueError naming ``name`` and the valid types unless it is a registered rm_type."""
    _, base = base_rm_type(name)
    if not isinstance(base, str) or base not in FAMILIES:
        raise ValueError(
            f"unknown rm_type {name!r}; valid types: {', '.join(RM_TYPES)} "
            f"(each may take the prefix {BOXED_PREFIX!r}), or set custom_rm_path")


def resolve(name: str, sample: Sample) -> tuple[LocalFamily | RemoteFamily, Sample]:
    """The family for ``name`` and the sample it grades (response replaced under ``boxed_``)."""
    validate_rm_type(name)
    boxed, base = base_rm_type(name)
    if boxed:
        sample = dataclasses.replace(sample, response=last_boxed(sample.response) or "")
    return FAMILIES[base], sample

"""The reward hub: score one sample, a batch, or a bare response; pick the scalar of a reward.

Dispatch (REFERENCE §4): ``custom_rm_path`` overrides everything (with ``group_rm`` it scores a
whole group per call); otherwise the sample's ``metadata["rm_type"]``, else ``opts.rm_type``,
looked up in :data:`miles_core.rewards.registry.FAMILIES` (``boxed_`` prefix allowed).
``batched_async_rm`` scores concurrently (``asyncio.gather``; CPU-bound graders run in a few worker
threads that share the batch, sympy in worker processes, so the event loop never blocks), then
applies ``custom_reward_post_process_path`` once to the whole batch (each sample's reward before it is kept
as ``metadata["raw_reward"]``, the scalar of ``reward_key``, for rollout/raw_reward; a dict reward without
``reward_key`` has no scalar, and rollout/raw_reward then falls back to the post-processed reward).
"""

from __future__ import annotations

import asyncio
from typing import Any

from miles_core.data.sample import Sample
from miles_core.rewards import custom
from miles_core.rewards.finite import require_finite
from miles_core.rewards.options import RewardOptions
from miles_core.rewards.registry import LocalFamily, grade_local_batch, resolve, validate_rm_type

Reward = float | dict[str, Any]


def sample_rm_type(sample: Sample, opts: RewardOptions) -> str:
    """The rm_type that scores ``sample``: its ``metadata["rm_type"]`` if set, else ``opts.rm_type``."""
    name = (sample.metadata or {}).get("rm_type")
    if name is None:
        return opts.rm_type
    try:
        validate_rm_type(name)
    except ValueError as exc:
        raise ValueError(f"sample {sample.index} metadata['rm_type']: {exc}") from exc
    return name


def score(rm_type: str, response: str, label: Any, metadata: dict | None = None) -> Reward:
    """Score one response synchronously (tools, tests); ``metadata["rm_type"]`` overrides ``rm_type``.

    ``remote_rm`` cannot be used here (no URL): use ``async_rm`` with ``RewardOptions``.
    """
    opts = RewardOptions(rm_type=rm_type)
    sample = Sample(response=response, label=label, metadata=dict(metadata or {}))
    family, graded = resolve(sample_rm_type(sample, opts), sample)
    return family.score(graded, opts)


def _source(sample: Sample, opts: RewardOptions) -> str:
    """The function that scores ``sample``, as a NaN-reward error names it."""
    if opts.custom_rm_path:
        return f"reward function {opts.custom_rm_path!r}{' (group_rm)' if opts.group_rm else ''}"
    return f"reward rm_type {sample_rm_type(sample, opts)!r}"


async def async_rm(sample: Sample, opts: RewardOptions) -> Reward:
    """The raw reward (float or dict) of one sample; NaN/inf is refused (NonFiniteReward)."""
    reward = await _raw_reward(sample, opts)
    require_finite([reward], [sample], [_source(sample, opts)])
    return reward


async def _raw_reward(sample: Sample, opts: RewardOptions) -> Reward:
    if opts.custom_rm_path and opts.group_rm:
        return (await custom.group_rewards(opts.custom_rm_path, [sample], opts))[0]
    if opts.custom_rm_path:
        return await custom.custom_reward(opts.custom_rm_path, sample, opts)
    family, graded = resolve(sample_rm_type(sample, opts), sample)
    return await family.ascore(graded, opts)


async def batched_async_rm(samples: list[Sample], opts: RewardOptions) -> list[Reward]:
    """Raw rewards of ``samples``, in order: per group with ``group_rm``, then post-processed; NaN/inf from any
    of these functions is refused (NonFiniteReward naming the function and the sample)."""
    if opts.custom_rm_path and opts.group_rm:
        rewards = await custom.group_rewards(opts.custom_rm_path, samples, opts)
    elif opts.custom_rm_path:
        rewards = list(await asyncio.gather(*(_raw_reward(s, opts) for s in samples)))
    else:
        rewards = await _family_rewards(samples, opts)
    require_finite(rewards, samples, [_source(s, opts) for s in samples])
    if opts.custom_reward_post_process_path:
        for sample, raw in zip(samples, rewards):  # rollout/raw_reward is the mean before post-processing
            if not isinstance(raw, dict) or opts.reward_key is not None:  # a dict without reward_key has no scalar
                sample.metadata["raw_reward"] = reward_value(raw, opts.reward_key)
        rewards = await custom.post_process(opts.custom_reward_post_process_path, samples, rewards, opts)
        path = opts.custom_reward_post_process_path
        require_finite(rewards, samples, [f"reward post-process function {path!r}"] * len(samples))
    return rewards


async def _family_rewards(samples: list[Sample], opts: RewardOptions) -> list[Reward]:
    """Registry rewards of ``samples``, in order: local graders share a few threads, the others run concurrently."""
    jobs = [resolve(sample_rm_type(s, opts), s) for s in samples]
    local = [i for i, (family, _) in enumerate(jobs) if isinstance(family, LocalFamily)]
    others = [i for i, (family, _) in enumerate(jobs) if not isinstance(family, LocalFamily)]
    graded = await asyncio.gather(grade_local_batch([jobs[i] for i in local]),
                                  *(jobs[i][0].ascore(jobs[i][1], opts) for i in others))
    rewards: list[Reward | None] = [None] * len(samples)
    for i, r in zip(local + others, [*graded[0], *graded[1:]]):
        rewards[i] = r
    return rewards


def reward_value(reward: Reward, key: str | None) -> float:
    """The scalar to train on: a number as is; for a dict, its field ``key`` (required).

    ``key`` is ignored for number rewards. Raises ValueError naming the key and the available
    keys when a dict reward has no ``key`` (or ``key`` is None), TypeError for other values.
    """
    if isinstance(reward, dict):
        if key is None:
            raise ValueError(f"dict reward needs a reward_key; available keys: {sorted(reward)}")
        if key not in reward:
            raise ValueError(f"reward_key {key!r} not in reward; available keys: {sorted(reward)}")
        reward = reward[key]
        if not isinstance(reward, (int, float)):
            raise TypeError(f"reward field {key!r} is {type(reward).__name__} {reward!r}, not a number")
    if isinstance(reward, (int, float)):
        return float(reward)
    raise TypeError(f"reward must be a number or a dict, got {type(reward).__name__} {reward!r}")

"""Custom reward functions used by the tests through dotted paths (``reward_fns:name``)."""

from __future__ import annotations

import asyncio

GROUP_CALLS: list[list[int]] = []  # group_index of each sample of every group call, in call order
POST_CALLS: list[int] = []  # batch size of every post-process call

NOT_CALLABLE = 3


async def length_reward(sample, **kwargs):
    await asyncio.sleep(0)
    return float(len(sample.response))


def sync_reward(sample):
    return 1 if "yes" in sample.response else 0


async def dict_reward(sample, **kwargs):
    return {"score": 1.0 if sample.label == sample.response else -1.0, "len": len(sample.response)}


async def bad_reward(sample, **kwargs):
    return "not a reward"


async def group_rank(samples, **kwargs):
    """Reward = rank of the response length inside its group (0 = shortest)."""
    GROUP_CALLS.append([s.group_index for s in samples])
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].response))
    ranks = [0.0] * len(samples)
    for rank, i in enumerate(order):
        ranks[i] = float(rank)
    return ranks


async def group_too_short(samples, **kwargs):
    return [1.0]


def center(samples, rewards):
    """Post-process: subtract the batch mean."""
    POST_CALLS.append(len(samples))
    mean = sum(rewards) / len(rewards)
    return [r - mean for r in rewards]


async def scores_of_dicts(samples, rewards):
    return [r["score"] for r in rewards]


def wrong_length(samples, rewards):
    return rewards[:-1]


async def nan_reward(sample, **kwargs):
    return float("nan") if sample.index == 1 else 1.0


def inf_in_dict(sample):
    return {"score": 1.0, "len": float("-inf")}


async def group_nan(samples, **kwargs):
    return [float("nan")] * len(samples)


def to_inf(samples, rewards):
    return [float("inf") for _ in rewards]

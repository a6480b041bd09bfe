"""Non-finite rewards stop where they are made: a NaN or inf reward (or a NaN/inf number in a dict reward)
from any reward path (a built-in rm_type, remote_rm, custom_rm_path, group_rm,
custom_reward_post_process_path) is refused naming the function and the sample, before it reaches an
advantage, a loss or a gradient (a NaN reward makes every advantage of its group NaN, then the loss and
every weight)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from miles_core.data.sample import Sample


class NonFiniteReward(ValueError):
    """A reward function returned NaN or inf for a sample."""


def _bad_number(reward: Any) -> tuple[str, float] | None:
    """(where, value) of the first non-finite number in ``reward`` (a number or a dict of them), else None."""
    if isinstance(reward, dict):
        for key, value in reward.items():
            if isinstance(value, (int, float)) and not math.isfinite(value):
                return f"[{key!r}]", float(value)
        return None
    if isinstance(reward, (int, float)) and not math.isfinite(reward):
        return "", float(reward)
    return None


def require_finite(rewards: Sequence[Any], samples: Sequence[Sample], sources: Sequence[str]) -> None:
    """Raise NonFiniteReward for the first sample whose reward holds NaN/inf; ``sources[i]`` names the function
    that scored ``samples[i]`` (e.g. ``reward function 'mod:fn'``)."""
    for reward, sample, source in zip(rewards, samples, sources):
        bad = _bad_number(reward)
        if bad is not None:
            where, value = bad
            raise NonFiniteReward(
                f"{source} returned {value}{' in field ' + where if where else ''} for sample {sample.index} "
                f"(prompt group {sample.group_index}, rollout {sample.rollout_id}): a reward must be a finite number; "
                "fix the function (e.g. return 0.0 for an ungradable response)")

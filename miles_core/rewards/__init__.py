"""Rewards (REFERENCE §4): one module per reward family, one name table keyed by rm_type.

Public API::

    RM_TYPES, validate_rm_type(name)            the registered names; config-time check
    RewardOptions                               reward settings (frozen dataclass)
    score(rm_type, response, label, metadata)   synchronous, for tools and tests
    async_rm(sample, opts)                      one sample -> float | dict
    batched_async_rm(samples, opts)             many samples, concurrently, group_rm, post-process
    reward_value(reward, key)                   the float to train on
    load_function(path)                         "pkg.mod:func" / "pkg.mod.func" -> the object

See docs/rewards.md for every family's rule and the extension points.
"""

from miles_core.resolve import resolve as load_function
from miles_core.rewards.hub import async_rm, batched_async_rm, reward_value, score
from miles_core.rewards.options import RewardOptions
from miles_core.rewards.registry import RM_TYPES, validate_rm_type

__all__ = [
    "RM_TYPES",
    "RewardOptions",
    "async_rm",
    "batched_async_rm",
    "load_function",
    "reward_value",
    "score",
    "validate_rm_type",
]

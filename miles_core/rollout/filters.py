"""Built-in dynamic-sampling filters. A filter takes one group of samples and returns
``FilterResult(keep, reason)``; a dropped group is counted as rollout/dynamic_filter/drop_<reason>.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from miles_core.data.sample import Sample, Status


@dataclass(frozen=True)
class FilterResult:
    keep: bool
    reason: str | None = None


def check_reward_nonzero_std(group: list[Sample], reward_of) -> FilterResult:
    """Keep groups whose rewards differ (they carry a learning signal); a single sample has no spread.
    Drop reason zero_std_<reward rounded to 1 decimal, as a float> (1 -> zero_std_1.0, the same
    spelling as rollout/zero_std/count_<r>)."""
    rewards = [float(reward_of(s)) for s in group]
    if len(rewards) > 1 and statistics.pstdev(rewards) > 0:
        return FilterResult(True)
    return FilterResult(False, f"zero_std_{round(rewards[0], 1)}")


def check_no_aborted(group: list[Sample], reward_of) -> FilterResult:
    """Keep groups without aborted samples."""
    if any(s.status == Status.ABORTED for s in group):
        return FilterResult(False, "group_has_aborted")
    return FilterResult(True)


FILTERS = {"check_reward_nonzero_std": check_reward_nonzero_std, "check_no_aborted": check_no_aborted}

"""Built-in dynamic-sampling filters. A filter takes one group of samples and returns
``FilterResult(keep, reason)``; a dropped group is counted as rollout/dynamic_filter/drop_<reason>.

``dynamic_sampling_filter_path`` takes a name of ``FILTERS``, or a dotted path to a filter in our form
``f(group, reward_of) -> FilterResult`` or in the reference system's form ``f(args, samples, **kwargs) ->
DynamicFilterOutput | bool`` (first parameter named ``args``; ``DynamicFilterOutput`` is ``FilterResult``,
import it from here; a bare bool means keep). ``args`` carries reward_key, n_samples_per_prompt,
rollout_batch_size and over_sampling_batch_size (the reference's names), so ``sample.get_reward_value(args)``
works.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from miles_core.data.sample import Sample, Status
from miles_core.resolve import reference_args, resolve, takes_reference_args


@dataclass(frozen=True)
class FilterResult:
    keep: bool
    reason: str | None = None


DynamicFilterOutput = FilterResult  # the reference's name


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


def load_filter(path: str, **args: object):
    """The filter at ``path`` (a FILTERS name or a dotted path) as ``f(group, reward_of) -> FilterResult``;
    a reference-style ``f(args, samples)`` is wrapped, with ``args`` built from the keyword arguments."""
    fn = resolve(path, FILTERS, "dynamic_sampling_filter_path")
    if not takes_reference_args(fn):
        return fn
    namespace = reference_args(**args)

    def reference_filter(group: list[Sample], reward_of) -> FilterResult:
        out = fn(namespace, group)
        if isinstance(out, bool):
            return FilterResult(out)
        if not hasattr(out, "keep"):
            raise TypeError(f"dynamic_sampling_filter_path={path!r} returned {type(out).__name__}; "
                            "expected DynamicFilterOutput(keep, reason) or a bool")
        return FilterResult(bool(out.keep), getattr(out, "reason", None))

    return reference_filter

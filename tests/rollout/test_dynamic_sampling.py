"""Dynamic sampling over a real HFEngine on the builtin tiny model: over-sampling rounds, the two
built-in filters and their drop reasons, rollout/dynamic_filter/drop_<reason> metrics.

Rewards are scripted (by prompt kind) so that which groups a filter drops is known exactly; the
engine, the loop and the filters are the real ones. Responses are at most 3 tokens to stay fast.
"""

from __future__ import annotations

import pytest

from miles_core.data.dataset import Prompt
from miles_core.data.sample import Status
from miles_core.data.source import DataSource
from miles_core.rewards import RewardOptions
from miles_core.rollout.filters import FILTERS, FilterResult, check_no_aborted, check_reward_nonzero_std
from miles_core.rollout.generate import RolloutSpec, generate_rollout
from miles_core.rollout.protocol import SamplingParams

KINDS = ["ones", "zeros", "mixed"]  # prompt i has kind KINDS[i % 3]
G = 2
pytestmark = pytest.mark.usefixtures("scripted_kind_rewards")


@pytest.fixture
def source(tiny_tokenizer):
    prompts = [
        Prompt(f"What is {i} + 1?", tiny_tokenizer(f"What is {i} + 1?")["input_ids"], str(i + 1), {"kind": KINDS[i % 3], "i": i})
        for i in range(12)
    ]
    return DataSource(prompts, shuffle=False, seed=0)


def _spec(tiny_tokenizer, want: int, over: int | None, filter_path: str | None) -> RolloutSpec:
    params = SamplingParams(temperature=1.0, max_new_tokens=3, stop_token_ids=(tiny_tokenizer.eos_token_id,))
    return RolloutSpec(rollout_batch_size=want, n_samples_per_prompt=G, params=params, over_sampling_batch_size=over, filter_path=filter_path, seed=1)


def _run(engine, source, spec, tok):
    return generate_rollout(engine, source, spec, RewardOptions(), rollout_id=0, decode=tok.decode)


def test_nonzero_std_filter_keeps_mixed_groups_and_counts_drops(engine, source, tiny_tokenizer):
    spec = _spec(tiny_tokenizer, want=2, over=6, filter_path="check_reward_nonzero_std")
    rollout = _run(engine, source, spec, tiny_tokenizer)
    # one round of 6 groups: prompts 0..5 = ones, zeros, mixed, ones, zeros, mixed -> keep 2, 5
    assert [s.metadata["i"] for s in rollout.samples] == [2, 2, 5, 5]
    assert rollout.metrics == {"rollout/dynamic_filter/drop_zero_std_1.0": 2.0, "rollout/dynamic_filter/drop_zero_std_0.0": 2.0}
    assert source.cursor.offset == 6
    assert all(s.response_length >= 1 and len(s.rollout_log_probs) == s.response_length for s in rollout.samples)


def test_rounds_continue_until_enough_groups_are_kept(engine, source, tiny_tokenizer):
    spec = _spec(tiny_tokenizer, want=3, over=3, filter_path="check_reward_nonzero_std")
    rollout = _run(engine, source, spec, tiny_tokenizer)  # one mixed group per round of 3
    assert [s.metadata["i"] for s in rollout.samples][::G] == [2, 5, 8]
    assert rollout.metrics == {"rollout/dynamic_filter/drop_zero_std_1.0": 3.0, "rollout/dynamic_filter/drop_zero_std_0.0": 3.0}
    assert source.cursor.offset == 9
    assert len({s.group_index for s in rollout.samples}) == 3


def test_sampling_gives_up_after_max_rounds_with_a_clear_error(engine, source, tiny_tokenizer):
    from dataclasses import replace

    spec = replace(_spec(tiny_tokenizer, want=3, over=3, filter_path="check_reward_nonzero_std"), max_rounds=2)
    with pytest.raises(RuntimeError, match=r"kept 2 of 3 groups in 2 rounds of 3 .*check_reward_nonzero_std"):
        _run(engine, source, spec, tiny_tokenizer)  # one mixed group per round: 3 rounds needed


def test_surplus_kept_groups_are_not_used_beyond_rollout_batch_size(engine, source, tiny_tokenizer):
    spec = _spec(tiny_tokenizer, want=1, over=6, filter_path="check_reward_nonzero_std")
    rollout = _run(engine, source, spec, tiny_tokenizer)
    assert len(rollout.samples) == G and rollout.samples[0].metadata["i"] == 2
    assert source.cursor.offset == 6  # the whole round was drawn


def test_groups_after_the_batch_is_full_are_not_counted_as_drops(engine, source, tiny_tokenizer):
    spec = _spec(tiny_tokenizer, want=1, over=6, filter_path="check_reward_nonzero_std")
    rollout = _run(engine, source, spec, tiny_tokenizer)  # prompts 0 (ones), 1 (zeros) dropped, 2 kept: full
    assert rollout.metrics == {"rollout/dynamic_filter/drop_zero_std_1.0": 1.0, "rollout/dynamic_filter/drop_zero_std_0.0": 1.0}


def test_no_filter_takes_the_first_groups(engine, source, tiny_tokenizer):
    rollout = _run(engine, source, _spec(tiny_tokenizer, want=2, over=None, filter_path=None), tiny_tokenizer)
    assert [s.metadata["i"] for s in rollout.samples][::G] == [0, 1]
    assert rollout.metrics == {}


class AbortingEngine:
    """Wraps an engine; requests for the given prompts come back aborted (as an engine abort would)."""

    def __init__(self, inner, abort_prompts: set[tuple[int, ...]]):
        self.inner, self.abort_prompts = inner, abort_prompts

    def generate(self, requests, seed):
        results = self.inner.generate(requests, seed)
        for req, res in zip(requests, results):
            if tuple(req.input_ids) in self.abort_prompts:
                res.finish_reason = "abort"
        return results


def test_no_aborted_filter_drops_groups_with_an_aborted_sample(engine, source, tiny_tokenizer):
    aborted = {tuple(source.prompts[i].input_ids) for i in (0, 2)}
    spec = _spec(tiny_tokenizer, want=2, over=4, filter_path="miles_core.rollout.filters.check_no_aborted")  # dotted path
    rollout = _run(AbortingEngine(engine, aborted), source, spec, tiny_tokenizer)
    assert [s.metadata["i"] for s in rollout.samples][::G] == [1, 3]
    assert all(s.status != Status.ABORTED for s in rollout.samples)
    assert rollout.metrics == {"rollout/dynamic_filter/drop_group_has_aborted": 2.0}


def test_builtin_filters_directly():
    from miles_core.data.sample import Sample

    def group(rewards, statuses=None):
        statuses = statuses or [Status.COMPLETED] * len(rewards)
        return [Sample(reward=r, status=st) for r, st in zip(rewards, statuses)]

    reward_of = lambda s: s.reward  # noqa: E731
    assert check_reward_nonzero_std(group([1.0, 0.0]), reward_of) == FilterResult(True)
    assert check_reward_nonzero_std(group([0.26, 0.26]), reward_of) == FilterResult(False, "zero_std_0.3")
    assert check_reward_nonzero_std(group([1, 1]), reward_of) == FilterResult(False, "zero_std_1.0")  # ints as floats
    assert check_reward_nonzero_std(group([1.0]), reward_of).keep is False  # a single sample has no spread
    assert check_no_aborted(group([0.0, 1.0], [Status.COMPLETED, Status.ABORTED]), reward_of) == FilterResult(False, "group_has_aborted")
    assert check_no_aborted(group([0.0, 1.0], [Status.COMPLETED, Status.TRUNCATED]), reward_of).keep
    assert sorted(FILTERS) == ["check_no_aborted", "check_reward_nonzero_std"]

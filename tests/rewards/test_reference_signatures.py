"""Custom reward functions written for the reference system (first parameter ``args``) run unchanged."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from miles_core.data.sample import Sample
from miles_core.rewards import RewardOptions, batched_async_rm
from miles_core.resolve import takes_reference_args

FIXTURES = str(Path(__file__).resolve().parents[1] / "fixtures" / "reference")
if FIXTURES not in sys.path:
    sys.path.insert(0, FIXTURES)

import reference_style_rm as ref  # noqa: E402


def _samples():
    # group 0: a right and a wrong answer; group 1: two right answers
    texts = [("so \\boxed{4}", "4"), ("\\boxed{5}", "4"), ("\\boxed{7}", "7"), ("x \\boxed{7}", "7")]
    return [Sample(group_index=i // 2, index=i, response=r, label=label) for i, (r, label) in enumerate(texts)]


def test_signature_detection():
    assert takes_reference_args(ref.reward_func) and takes_reference_args(ref.filter_func)
    assert takes_reference_args(ref.tis_func) and not takes_reference_args(lambda sample: 1.0)
    assert not takes_reference_args(lambda samples, rewards: rewards)


@pytest.mark.parametrize("group_rm", [False, True])
def test_reference_reward_and_group_reward(group_rm):
    path = "reference_style_rm.group_reward_func" if group_rm else "reference_style_rm.reward_func"
    rewards = asyncio.run(batched_async_rm(_samples(), RewardOptions(custom_rm_path=path, group_rm=group_rm, reward_key="score")))
    assert [r["score"] for r in rewards] == [1.0, 0.0, 1.0, 1.0]
    assert rewards[1]["pred"] == "5"


def test_reference_post_process_returns_raw_and_processed():
    samples = _samples()
    opts = RewardOptions(custom_rm_path="reference_style_rm.reward_func", reward_key="score",
                         custom_reward_post_process_path="reference_style_rm.post_process_func")
    rewards = asyncio.run(batched_async_rm(samples, opts))
    assert rewards == [2.0, 0.0, 2.0, 2.0]  # the processed rewards are trained on
    assert [s.metadata["raw_reward"] for s in samples] == [1.0, 0.0, 1.0, 1.0]  # rollout/raw_reward reads these


def test_our_post_process_keeps_the_raw_reward():
    samples = _samples()
    opts = RewardOptions(custom_rm_path="reference_style_rm.reward_func", reward_key="score",
                         custom_reward_post_process_path="reward_fns.scores_of_dicts")
    rewards = asyncio.run(batched_async_rm(samples, opts))  # our form f(samples, rewards) -> rewards
    assert [s.metadata["raw_reward"] for s in samples] == [1.0, 0.0, 1.0, 1.0]
    assert rewards == [1.0, 0.0, 1.0, 1.0]


def test_reference_sample_accessors():
    s = Sample(reward={"score": 0.5}, loss_mask=[1, 0, 1], response_length=3, status=Sample.Status.TRUNCATED)
    assert s.get_reward_value(type("A", (), {"reward_key": "score"})()) == 0.5
    assert s.effective_response_length == 2 and s.status == Sample.Status.TRUNCATED
    assert "Status" not in s.to_dict()  # a class attribute, not a field

"""Every reward path refuses NaN/inf, naming the function and the sample (issue 30, finding 1)."""

from __future__ import annotations

import asyncio

import pytest
import reward_fns

from miles_core.data.sample import Sample
from miles_core.rewards import RewardOptions, async_rm, batched_async_rm
from miles_core.rewards.finite import NonFiniteReward
from miles_core.rewards.registry import FAMILIES, LocalFamily

FNS = reward_fns.__name__


def _samples(n: int = 3) -> list[Sample]:
    return [Sample(group_index=i // 2, index=i, rollout_id=4, response="yes", label="yes") for i in range(n)]


@pytest.mark.parametrize("opts, needle", [
    (RewardOptions(custom_rm_path=f"{FNS}:nan_reward"), f"reward function '{FNS}:nan_reward' returned nan for sample 1 "
                                                         "(prompt group 0, rollout 4)"),
    (RewardOptions(custom_rm_path=f"{FNS}:inf_in_dict", reward_key="score"), "returned -inf in field ['len'] for sample 0"),
    (RewardOptions(custom_rm_path=f"{FNS}:group_nan", group_rm=True), f"'{FNS}:group_nan' (group_rm) returned nan for sample 0"),
    (RewardOptions(custom_reward_post_process_path=f"{FNS}:to_inf"), f"reward post-process function '{FNS}:to_inf' returned inf"),
], ids=["custom", "custom dict", "group", "post-process"])
def test_a_non_finite_reward_is_refused_naming_the_function_and_the_sample(opts, needle):
    with pytest.raises(NonFiniteReward) as err:
        asyncio.run(batched_async_rm(_samples(), opts))
    assert needle in str(err.value)


def test_a_built_in_rm_type_returning_nan_is_refused(monkeypatch):
    monkeypatch.setitem(FAMILIES, "f1", LocalFamily(lambda sample: float("nan")))
    with pytest.raises(NonFiniteReward, match="reward rm_type 'f1' returned nan for sample 0"):
        asyncio.run(batched_async_rm(_samples(1), RewardOptions(rm_type="f1")))
    with pytest.raises(NonFiniteReward, match="rm_type 'f1' returned nan for sample 2"):
        asyncio.run(async_rm(_samples()[2], RewardOptions(rm_type="f1")))


def test_finite_rewards_pass_unchanged():
    assert asyncio.run(batched_async_rm(_samples(2), RewardOptions(custom_rm_path=f"{FNS}:sync_reward"))) == [1.0, 1.0]

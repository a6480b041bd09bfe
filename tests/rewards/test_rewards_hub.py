"""async_rm / batched_async_rm: dispatch order, boxed_, custom and group functions, post-process."""

from __future__ import annotations

import asyncio
import time

import pytest
import reward_fns

from miles_core.data.sample import Sample
from miles_core.rewards import RewardOptions, async_rm, batched_async_rm, load_function, reward_value

FNS = reward_fns.__name__


def run(coro):
    return asyncio.run(coro)


def test_async_rm_uses_opts_rm_type():
    sample = Sample(response=r"\boxed{0.5}", label=r"\frac12")
    assert run(async_rm(sample, RewardOptions())) == 1.0
    assert run(async_rm(sample, RewardOptions(rm_type="f1"))) == 0.0


def test_async_rm_per_sample_rm_type_wins():
    sample = Sample(response="Paris", label="Paris", metadata={"rm_type": "f1"})
    assert run(async_rm(sample, RewardOptions(rm_type="math"))) == 1.0
    bad = Sample(response="x", label="x", metadata={"rm_type": "nope"})
    with pytest.raises(ValueError, match="'nope'"):
        run(async_rm(bad, RewardOptions()))


def test_boxed_prefix_grades_the_boxed_content_and_keeps_the_sample():
    sample = Sample(response=r"I say \boxed{Paris}", label="Paris")
    assert run(async_rm(sample, RewardOptions(rm_type="boxed_f1"))) == 1.0
    assert sample.response == r"I say \boxed{Paris}"  # the caller's sample is not modified


def test_custom_rm_path_overrides_every_rm_type():
    sample = Sample(response="abcd", metadata={"rm_type": "math"})
    for path in (f"{FNS}:length_reward", f"{FNS}.length_reward"):
        assert run(async_rm(sample, RewardOptions(rm_type="gpqa", custom_rm_path=path))) == 4.0
    assert run(async_rm(Sample(response="yes"), RewardOptions(custom_rm_path=f"{FNS}:sync_reward"))) == 1.0


def test_custom_dict_reward_and_reward_key():
    opts = RewardOptions(custom_rm_path=f"{FNS}:dict_reward", reward_key="score")
    reward = run(async_rm(Sample(response="a", label="a"), opts))
    assert reward == {"score": 1.0, "len": 1}
    assert reward_value(reward, opts.reward_key) == 1.0
    assert reward_value(reward, "len") == 1.0


def test_custom_rm_bad_return_and_bad_path_are_clear():
    with pytest.raises(TypeError, match="bad_reward"):
        run(async_rm(Sample(), RewardOptions(custom_rm_path=f"{FNS}:bad_reward")))
    with pytest.raises(ValueError, match="no_such_fn"):
        run(async_rm(Sample(), RewardOptions(custom_rm_path=f"{FNS}:no_such_fn")))


def test_batched_scores_mixed_types_in_order():
    samples = [
        Sample(index=0, response=r"\boxed{2\sqrt{2}}", label=r"\sqrt{8}"),
        Sample(index=1, response="Paris", label="Paris", metadata={"rm_type": "f1"}),
        Sample(index=2, response=r"\boxed{3}", label="4"),
        Sample(index=3, response="Answer: 7", label="7", metadata={"rm_type": "dapo"}),
        Sample(index=4, response=None, label=None),
    ]
    rewards = run(batched_async_rm(samples, RewardOptions()))
    assert rewards[:3] == [1.0, 1.0, 0.0] and rewards[4] == 0.0
    assert rewards[3] == {"score": 1.0, "acc": True, "pred": "7"}


def test_batched_never_blocks_the_event_loop(warm_sympy):
    samples = [Sample(response=rf"\boxed{{{i}x^2+2x+1}}", label=rf"({i}x+1)^2") for i in range(1, 13)]
    samples.append(Sample(response=r"\boxed{9^{9^{9^{9}}}}", label="1"))  # 2 s in a worker

    async def main():
        gaps, last = [], time.monotonic()
        task = asyncio.ensure_future(batched_async_rm(samples, RewardOptions()))
        while not task.done():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now
        return task.result(), max(gaps)

    rewards, worst_gap = run(main())
    assert rewards == [1.0] + [0.0] * 12  # only 1*x^2+2x+1 == (1x+1)^2
    assert worst_gap < 0.25, f"event loop stalled for {worst_gap:.3f}s"


def test_group_rm_calls_the_function_once_per_group():
    reward_fns.GROUP_CALLS.clear()
    samples = [Sample(group_index=g, index=i, response="x" * n)
               for i, (g, n) in enumerate([(0, 3), (1, 1), (0, 1), (1, 5), (0, 2)])]
    opts = RewardOptions(custom_rm_path=f"{FNS}:group_rank", group_rm=True)
    rewards = run(batched_async_rm(samples, opts))
    # group 0 lengths 3,1,2 -> ranks 2,0,1; group 1 lengths 1,5 -> ranks 0,1
    assert rewards == [2.0, 0.0, 0.0, 1.0, 1.0]
    assert sorted(reward_fns.GROUP_CALLS) == [[0, 0, 0], [1, 1]]
    assert run(async_rm(samples[0], opts)) == 0.0  # a lone sample is a group of one


def test_group_rm_wrong_length_is_clear():
    opts = RewardOptions(custom_rm_path=f"{FNS}:group_too_short", group_rm=True)
    with pytest.raises(ValueError, match="group_too_short.*1 rewards for 2 samples"):
        run(batched_async_rm([Sample(), Sample()], opts))


def test_post_process_runs_once_on_the_whole_batch():
    reward_fns.POST_CALLS.clear()
    samples = [Sample(response=r"\boxed{1}", label="1"), Sample(response=r"\boxed{2}", label="1")]
    opts = RewardOptions(custom_reward_post_process_path=f"{FNS}:center")
    assert run(batched_async_rm(samples, opts)) == [0.5, -0.5]
    assert reward_fns.POST_CALLS == [2]
    dict_opts = RewardOptions(rm_type="dapo", custom_reward_post_process_path=f"{FNS}:scores_of_dicts")
    assert run(batched_async_rm([Sample(response="Answer: 1", label="1")], dict_opts)) == [1.0]


def test_post_process_wrong_length_is_clear():
    opts = RewardOptions(custom_reward_post_process_path=f"{FNS}:wrong_length")
    with pytest.raises(ValueError, match="wrong_length.*1 rewards for 2 samples"):
        run(batched_async_rm([Sample(), Sample()], opts))


def test_load_function_forms_and_errors():
    assert load_function(f"{FNS}:center") is reward_fns.center
    assert load_function(f"{FNS}.center") is reward_fns.center
    assert load_function("os.path:join.__call__")  # nested attribute after the colon
    for path, needle in [
        ("no_such_module_xyz:f", "no_such_module_xyz"),
        (f"{FNS}:missing", "missing"),
        (f"{FNS}:NOT_CALLABLE", "non-callable"),
        ("justaname", "justaname"),
        ("", "invalid function path"),
    ]:
        with pytest.raises(ValueError, match=needle):
            load_function(path)

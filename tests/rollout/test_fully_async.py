"""The fully-async worker over a real HFEngine on the builtin tiny model: the bounded buffer, the
staleness bound (recycle / drop), pause, checkpoint state, errors. Rewards are scripted by prompt so
the filter's choices are known; the weight version is a counter the test moves, as a sync would.
"""

from __future__ import annotations

import time

import pytest

from miles_core.data.dataset import Prompt
from miles_core.data.source import DataSource
from miles_core.rewards import RewardOptions
from miles_core.rollout import fully_async as fa
from miles_core.rollout.fully_async import FullyAsyncWorker
from miles_core.rollout.generate import RolloutSpec
from miles_core.rollout.protocol import SamplingParams

G = 2


@pytest.fixture
def source(tiny_tokenizer):
    prompts = [Prompt(f"What is {i} + 1?", tiny_tokenizer(f"What is {i} + 1?")["input_ids"], str(i + 1), {"i": i}) for i in range(40)]
    return DataSource(prompts, shuffle=False, seed=0)


@pytest.fixture(autouse=True)
def scripted_rewards(monkeypatch):
    """Even prompts score 0/1 by sample parity (kept by the nonzero-std filter), odd prompts all 0 (dropped)."""

    async def fake_rm(samples, opts):
        return [float(s.index % 2) if s.metadata["i"] % 2 == 0 else 0.0 for s in samples]

    monkeypatch.setattr(fa, "batched_async_rm", fake_rm)


class Version:
    """The engine's weight version; the test moves it (inside paused()) as a weight sync would."""

    def __init__(self, engine):
        self.engine = engine
        engine.set_weight_version(1)

    @property
    def v(self) -> int:
        return self.engine.get_weight_version()

    @v.setter
    def v(self, value: int) -> None:
        self.engine.set_weight_version(value)

    def __call__(self) -> int:
        return self.v


def _worker(engine, source, tok, version, *, capacity=4, max_staleness=None, policy="recycle", filter_path=None, want=2):
    params = SamplingParams(temperature=1.0, max_new_tokens=2, stop_token_ids=(tok.eos_token_id,))
    spec = RolloutSpec(rollout_batch_size=want, n_samples_per_prompt=G, params=params, filter_path=filter_path, seed=3)
    return FullyAsyncWorker(engine, source, spec, RewardOptions(), tok.decode, version, capacity=capacity,
                            max_staleness=max_staleness, policy=policy)


def _wait_full(w: FullyAsyncWorker, n: int) -> None:
    deadline = time.time() + 60
    while len(w.buffer) < n:
        assert w._error is None, w._error
        assert time.time() < deadline, "the worker did not fill its buffer"
        time.sleep(0.01)


def test_buffer_is_bounded_and_groups_carry_their_version(engine, source, tiny_tokenizer):
    version = Version(engine)
    w = _worker(engine, source, tiny_tokenizer, version, capacity=4)
    try:
        w.start()
        _wait_full(w, 4)
        time.sleep(0.2)
        assert len(w.buffer) == 4  # the worker waits while the buffer is full
        groups, m = w.take(2, rollout_id=7)
        assert [len(g) for g in groups] == [G, G]
        assert all(s.rollout_id == 7 and s.weight_versions == [1] for g in groups for s in g)
        assert m["rollout/fully_async/avg_staleness"] == 0.0 and m["rollout/fully_async/queue_size"] == 2.0
    finally:
        w.stop()


def test_stale_groups_are_recycled_and_no_prompt_is_lost_or_repeated(engine, source, tiny_tokenizer):
    version = Version(engine)
    w = _worker(engine, source, tiny_tokenizer, version, capacity=4, max_staleness=1)
    try:
        with w.paused():  # nothing is generated while paused
            w.start()
            time.sleep(0.2)
            assert not w.buffer
        _wait_full(w, 4)
        with w.paused():
            version.v = 3  # two syncs happened: the 4 buffered groups (version 1) are 2 stale
            stale = sorted(g[0].group_index for g in w.buffer)
        taken, m = w.take(2, rollout_id=0)
        # every buffered group was examined: 4 recycled, then regenerated at version 3 and taken
        assert m["rollout/fully_async/stale_groups_recycled"] >= 4 and m["rollout/fully_async/max_staleness"] <= 1
        assert all(s.weight_versions == [3] for g in taken for s in g)
        more, _ = w.take(4, rollout_id=1)
        trained = [g[0].group_index for g in taken + more]
        assert len(trained) == len(set(trained))  # no group trained twice
        assert set(stale) <= set(trained) | {gi for gi, _ in w.recycled} | {g[0].group_index for g in w.buffer}
    finally:
        w.stop()


def test_drop_policy_discards_stale_groups(engine, source, tiny_tokenizer):
    version = Version(engine)
    w = _worker(engine, source, tiny_tokenizer, version, capacity=2, max_staleness=0, policy="drop")
    try:
        w.start()
        _wait_full(w, 2)
        with w.paused():
            version.v = 2
        groups, m = w.take(2, rollout_id=0)
        assert m["rollout/fully_async/stale_groups_filtered"] >= 2 and m["rollout/fully_async/stale_groups_recycled"] == 0
        assert not w.recycled and all(s.weight_versions == [2] for g in groups for s in g)
    finally:
        w.stop()


def test_filter_drops_are_reported_with_the_next_take(engine, source, tiny_tokenizer):
    w = _worker(engine, source, tiny_tokenizer, Version(engine), capacity=4, filter_path="check_reward_nonzero_std")
    try:
        groups, m = w.take(3, rollout_id=0)
        assert all(g[0].metadata["i"] % 2 == 0 for g in groups)  # odd prompts have zero reward std
        assert m["rollout/dynamic_filter/drop_zero_std_0.0"] >= 3
    finally:
        w.stop()


def test_state_dict_round_trip_keeps_buffer_and_recycled_prompts(engine, source, tiny_tokenizer):
    version = Version(engine)
    w = _worker(engine, source, tiny_tokenizer, version, capacity=4, max_staleness=0)
    w.start()
    _wait_full(w, 4)
    with w.paused():
        w.recycled.append(fa._prompt_of(w.buffer.popleft()))
        state = w.state_dict()
        cursor = source.state_dict()
    w.stop()
    assert len(state["buffer"]) == 3 and len(state["recycled"]) == 1

    restored_source = DataSource(source.prompts, shuffle=False, seed=0)
    restored_source.load_state_dict(cursor)
    w2 = _worker(engine, restored_source, tiny_tokenizer, version, capacity=4, max_staleness=0)
    w2.load_state_dict(state)
    try:
        assert [g[0].group_index for g in w2.buffer] == [d[0]["group_index"] for d in state["buffer"]]
        groups, _ = w2.take(4, rollout_id=0)
        indices = [g[0].group_index for g in groups]
        # the 3 buffered groups first, then the recycled prompt (regenerated), nothing new ahead of it
        assert indices[:3] == [d[0]["group_index"] for d in state["buffer"]]
        assert indices[3] == state["recycled"][0][0]["group_index"]
    finally:
        w2.stop()


def test_worker_error_reaches_the_trainer(engine, source, tiny_tokenizer, monkeypatch):
    async def broken_rm(samples, opts):
        raise ValueError("reward server down")

    monkeypatch.setattr(fa, "batched_async_rm", broken_rm)
    w = _worker(engine, source, tiny_tokenizer, Version(engine))
    try:
        with pytest.raises(RuntimeError, match="reward server down"):
            w.take(1, rollout_id=0)
    finally:
        w.stop()


def test_pause_waits_for_the_round_in_flight_and_freezes_the_buffer(engine, source, tiny_tokenizer):
    w = _worker(engine, source, tiny_tokenizer, Version(engine), capacity=40, want=8)
    try:
        w.start()
        time.sleep(0.05)
        with w.paused():
            assert not w._busy
            n = len(w.buffer)
            time.sleep(0.3)
            assert len(w.buffer) == n
            groups, _ = w.take(n, rollout_id=0) if n else ([], {})  # room to go on, even if it had filled up
            assert len(groups) == n and not w.buffer
        _wait_full(w, 1)  # and it goes on after the pause
    finally:
        w.stop()


class RoundSizes:
    """Wraps an engine; records how many requests each generate call (one worker round) sends."""

    def __init__(self, inner):
        self.inner, self.sizes = inner, []

    def generate(self, requests, seed):
        self.sizes.append(len(requests))
        return self.inner.generate(requests, seed)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_async_max_concurrent_samples_and_capacity_factor_size_rounds_and_buffer(engine, source, tiny_tokenizer, tmp_path):
    """The reference's FullyAsyncRolloutFn / DefaultDataBuffer: async_max_concurrent_samples // G groups generate at
    once (default the batch size), the buffer holds int(async_data_buffer_capacity_factor * rollout_batch_size)."""
    from flows.recipes import load_config
    from miles_core.runtime.runtime import Runtime, RunData

    def runtime_worker(**over):
        cfg = load_config("tiny", {"async_mode": "fully", "colocate": False, "rollout_batch_size": 4, "n_samples_per_prompt": G,
                                   "run_dir": str(tmp_path), **over})
        data = RunData(model_path=tmp_path, tokenizer=tiny_tokenizer, source=source, num_prompts=40, dropped_prompts=0,
                       context_len=None, eval_suite=None, params=SamplingParams(max_new_tokens=2), rewards=RewardOptions())
        rt = Runtime.__new__(Runtime)
        rt.cfg, rt.data, rt._async_worker = cfg, data, None
        rt.fleet = type("Fleet", (), {"engine": RoundSizes(engine)})()
        return rt.fully_async_worker()

    default = runtime_worker()
    assert (default.capacity, default.round_groups) == (8, 4)
    w = runtime_worker(async_max_concurrent_samples=5, async_data_buffer_capacity_factor=1.5)
    assert (w.capacity, w.round_groups) == (6, 2)  # int(1.5 * 4); 5 // 2 samples per group
    Version(engine)
    try:
        w.start()
        _wait_full(w, 6)
        time.sleep(0.2)
        assert len(w.buffer) == 6 and w.engine.sizes == [2 * G] * 3  # three rounds of 2 groups, then full
    finally:
        w.stop()
    assert runtime_worker(async_max_concurrent_samples=1).round_groups == 1  # at least one group


def test_async_unused_samples_handler_chooses_the_stale_policy(engine, source, tiny_tokenizer, tmp_path):
    """The reference's --async-unused-samples-handler (DefaultDataBuffer: drop, its default, or retry): the runtime's
    worker drops or recycles stale groups; stale_group_policy, when set, instead. The drop worker is exercised by
    test_drop_policy_discards_stale_groups, recycle by test_stale_groups_are_recycled_and_no_prompt_is_lost_or_repeated."""
    from flows.recipes import load_config
    from miles_core.runtime.runtime import Runtime, RunData

    def policy(**over):
        rt = Runtime.__new__(Runtime)
        rt.cfg = load_config("tiny", {"async_mode": "fully", "colocate": False, "run_dir": str(tmp_path), **over})
        rt.data = RunData(model_path=tmp_path, tokenizer=tiny_tokenizer, source=source, num_prompts=40, dropped_prompts=0,
                          context_len=None, eval_suite=None, params=SamplingParams(max_new_tokens=2), rewards=RewardOptions())
        rt.fleet, rt._async_worker = type("Fleet", (), {"engine": engine})(), None
        return rt.fully_async_worker().policy

    assert policy() == "drop" and policy(async_unused_samples_handler="retry") == "recycle"
    assert policy(stale_group_policy="recycle") == "recycle"

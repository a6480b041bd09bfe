"""Partial rollout over a real HFEngine on the builtin tiny model: the groups of an over-sampled
round that were not used go to the data source's buffer, the next rollout takes them first (not
regenerated, filtered again), aborted samples are continued, no group index is lost or repeated,
and the buffer survives a checkpoint save + load exactly.

Rewards are scripted by prompt kind (as in test_dynamic_sampling.py) so which groups the filter
keeps is known; prompt i has kind ones / zeros / mixed for i % 3 = 0 / 1 / 2. Responses <= 3 tokens.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from miles_core import checkpoint as ckpt
from miles_core.data.dataset import Prompt
from miles_core.data.sample import Status
from miles_core.data.source import DataSource
from miles_core.rewards import RewardOptions
from miles_core.rollout import filters as filters_mod
from miles_core.rollout.filters import check_reward_nonzero_std
from miles_core.rollout.generate import RolloutSpec, generate_rollout
from miles_core.rollout.protocol import SamplingParams

KINDS = ["ones", "zeros", "mixed"]
G = 2
pytestmark = pytest.mark.usefixtures("scripted_kind_rewards")
MAX_NEW = 3


def _prompts(tok) -> list[Prompt]:
    return [Prompt(f"What is {i} + 1?", tok(f"What is {i} + 1?")["input_ids"], str(i + 1), {"kind": KINDS[i % 3], "i": i})
            for i in range(12)]


@pytest.fixture
def source(tiny_tokenizer):
    return DataSource(_prompts(tiny_tokenizer), shuffle=False, seed=0)


class CountingEngine:
    """Wraps an engine; records every request. `abort` = prompt ids whose requests come back, the first
    time only, cut to their first token with finish reason "abort" (what an engine abort returns)."""

    def __init__(self, inner, abort: set[tuple[int, ...]] = frozenset()):
        self.inner, self.abort, self.requests = inner, set(abort), []

    def generate(self, requests, seed):
        self.requests.extend(requests)
        results = self.inner.generate(requests, seed)
        for req, res in zip(requests, results):
            if tuple(req.input_ids) in self.abort:
                res.output_ids, res.output_log_probs, res.finish_reason = res.output_ids[:1], res.output_log_probs[:1], "abort"
        self.abort.clear()
        return results

    def set_weight_version(self, v):
        self.inner.set_weight_version(v)


def _spec(tok, want, over, filter_path="check_reward_nonzero_std", partial=True) -> RolloutSpec:
    params = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW, stop_token_ids=(tok.eos_token_id,))
    return RolloutSpec(rollout_batch_size=want, n_samples_per_prompt=G, params=params, over_sampling_batch_size=over, filter_path=filter_path, seed=1, partial_rollout=partial)


def _run(engine, source, spec, tok, rollout_id):
    return generate_rollout(engine, source, spec, RewardOptions(), rollout_id=rollout_id, decode=tok.decode)


def _ids(groups_or_samples) -> list[int]:
    return [g[0].group_index if isinstance(g, list) else g.group_index for g in groups_or_samples]


def test_unused_groups_are_buffered_and_taken_first_without_regenerating(engine, source, tiny_tokenizer):
    eng = CountingEngine(engine)
    spec = _spec(tiny_tokenizer, want=1, over=6)
    r0 = _run(eng, source, spec, tiny_tokenizer, 0)
    # round of 6: 0 ones (drop), 1 zeros (drop), 2 mixed (kept: full); 3, 4, 5 not examined -> buffer
    assert _ids(r0.samples[::G]) == [2] and _ids(source.buffer) == [3, 4, 5]
    assert r0.metrics["rollout/partial_rollout/buffer_groups"] == 3.0
    assert r0.metrics["rollout/partial_rollout/reused_groups"] == 0.0
    assert len(eng.requests) == 6 * G
    buffered = [s.to_dict() for g in source.buffer for s in g]

    engine.set_weight_version(1)
    eng.requests.clear()
    r1 = _run(eng, source, spec, tiny_tokenizer, 1)
    # round of 6 = buffered 3, 4, 5 + new 6, 7, 8: 3 drop, 4 drop, 5 kept; 6, 7, 8 -> buffer
    assert _ids(r1.samples[::G]) == [5] and _ids(source.buffer) == [6, 7, 8]
    assert len(eng.requests) == 3 * G  # only the new groups were generated
    assert r1.metrics == {"rollout/dynamic_filter/drop_zero_std_1.0": 1.0, "rollout/dynamic_filter/drop_zero_std_0.0": 1.0,
                          "rollout/partial_rollout/reused_groups": 3.0, "rollout/partial_rollout/buffer_groups": 3.0}
    reused = [{**d, "rollout_id": 1} for d in buffered if d["group_index"] == 5]
    assert [s.to_dict() for s in r1.samples] == reused  # the very samples of rollout 0, rollout_id set to 1
    assert all(s.weight_versions == [0] for s in r1.samples)  # generated before the sync: the lag is visible
    assert all(s.weight_versions == [1] for g in source.buffer for s in g)


def test_without_partial_rollout_unused_groups_are_discarded(engine, source, tiny_tokenizer):
    spec = _spec(tiny_tokenizer, want=1, over=6, partial=False)
    r0 = _run(engine, source, spec, tiny_tokenizer, 0)
    r1 = _run(engine, source, spec, tiny_tokenizer, 1)
    assert _ids(r0.samples[::G]) == [2] and _ids(r1.samples[::G]) == [8]  # 3..5 lost with the round
    assert source.buffer == [] and not any("partial_rollout" in k for k in r1.metrics)


def test_aborted_samples_are_continued_with_their_partial_tokens(engine, source, tiny_tokenizer):
    prompt2 = tuple(source.prompts[2].input_ids)
    eng = CountingEngine(engine, abort={prompt2})
    spec = _spec(tiny_tokenizer, want=1, over=4, filter_path=None)
    _run(eng, source, spec, tiny_tokenizer, 0)  # group 0 kept; 1, 2, 3 buffered, group 2 aborted after 1 token
    (g2,) = [g for g in source.buffer if g[0].group_index == 2]
    assert all(s.status == Status.ABORTED and s.response_length == 1 and s.weight_versions == [0] for s in g2)
    partial = [list(s.tokens) for s in g2]
    first_lp = [s.rollout_log_probs[0] for s in g2]

    engine.set_weight_version(1)
    eng.requests.clear()
    r1 = _run(eng, source, _spec(tiny_tokenizer, want=2, over=4, filter_path=None), tiny_tokenizer, 1)
    assert _ids(r1.samples[::G]) == [1, 2] and _ids(source.buffer) == [3, 4]
    # requests: group 2 continued from prompt + its partial token with the budget left, then new group 4
    assert [list(r.input_ids) for r in eng.requests[:G]] == partial
    assert [r.params.max_new_tokens for r in eng.requests] == [MAX_NEW - 1] * G + [MAX_NEW] * G
    for s, before, lp in zip(r1.samples[G:], partial, first_lp):
        assert s.status in (Status.COMPLETED, Status.TRUNCATED) and s.tokens[: len(before)] == before
        assert s.weight_versions == [0, 1] and s.rollout_log_probs[0] == lp
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length > 1
        assert s.response == tiny_tokenizer.decode(s.response_tokens)
        assert s.reward is not None


def test_every_group_index_is_handed_out_exactly_once(engine, source, tiny_tokenizer, monkeypatch):
    examined = []

    def recording(group, reward_of):
        examined.append(group[0].group_index)
        return check_reward_nonzero_std(group, reward_of)

    monkeypatch.setitem(filters_mod.FILTERS, "recording", recording)
    spec = _spec(tiny_tokenizer, want=2, over=5, filter_path="recording")
    trained = []
    for rid in range(5):
        engine.set_weight_version(rid)
        rollout = _run(engine, source, spec, tiny_tokenizer, rid)
        trained += _ids(rollout.samples[::G])
        assert all(s.rollout_id == rid for s in rollout.samples)
    left = _ids(source.buffer)
    assert left, "the run should end with groups in the buffer"
    assert len(examined) == len(set(examined))  # each group filtered once
    assert sorted(examined + left) == list(range(source.cursor.next_group_index))  # none lost
    assert set(trained) <= set(examined) and len(trained) == 5 * 2


def _rollouts(engine, source, spec, tok, ids) -> list[list[dict]]:
    out = []
    for rid in ids:
        engine.set_weight_version(rid)
        out.append([s.to_dict() for s in _run(engine, source, spec, tok, rid).samples])
    return out


def test_buffer_survives_a_checkpoint_and_resume_is_exact(engine, tiny_tokenizer, tmp_path):
    spec = _spec(tiny_tokenizer, want=2, over=5)
    straight = _rollouts(engine, DataSource(_prompts(tiny_tokenizer), shuffle=True, seed=3), spec, tiny_tokenizer, range(4))

    first = DataSource(_prompts(tiny_tokenizer), shuffle=True, seed=3)
    before = _rollouts(engine, first, spec, tiny_tokenizer, range(2))
    assert first.buffer, "the checkpoint should hold a non-empty buffer"
    ckpt.save_checkpoint(tmp_path, 1, model=torch.nn.Linear(2, 2), state={"data_source": first.state_dict()})
    meta = json.loads((tmp_path / "1" / "meta.json").read_text())
    assert len(meta["data_source"]["buffer"]) == len(first.buffer)

    resumed = DataSource(_prompts(tiny_tokenizer), shuffle=True, seed=3)  # a fresh source, as in a new process
    resumed.load_state_dict(ckpt.load_checkpoint(ckpt.find_latest(tmp_path), model=torch.nn.Linear(2, 2))["data_source"])
    assert resumed.state_dict() == first.state_dict()
    after = _rollouts(engine, resumed, spec, tiny_tokenizer, range(2, 4))
    assert before + after == straight


def test_state_without_a_buffer_still_loads(tiny_tokenizer):
    source = DataSource(_prompts(tiny_tokenizer), shuffle=False, seed=0)
    source.load_state_dict({"offset": 4, "epoch": 1, "next_group_index": 16})  # a checkpoint from before the buffer
    assert source.buffer == [] and source.cursor.next_group_index == 16


def test_mask_offpolicy_masks_the_tokens_older_weights_generated(engine, source, tiny_tokenizer):
    """mask_offpolicy_in_partial_rollout (the reference's generate_and_rm, miles/rollout/sglang_rollout.py): a buffered
    sample's tokens get loss mask 0 when a later rollout takes it: an aborted one trains only on what it generates on
    top, a finished one on nothing. Without the flag both keep mask 1 (the test above)."""
    prompt2 = tuple(source.prompts[2].input_ids)
    eng = CountingEngine(engine, abort={prompt2})
    spec = replace(_spec(tiny_tokenizer, want=1, over=4, filter_path=None), mask_offpolicy=True)
    r0 = _run(eng, source, spec, tiny_tokenizer, 0)  # group 0 kept (nothing buffered yet: mask 1); 1, 2, 3 buffered
    assert all(s.loss_mask == [1] * s.response_length for s in r0.samples)
    finished = {s.index: s.response_length for s in source.buffer[0]}  # group 1: finished in rollout 0
    r1 = _run(eng, source, replace(spec, rollout_batch_size=2), tiny_tokenizer, 1)
    g1, g2 = r1.samples[:G], r1.samples[G:]
    assert [s.loss_mask for s in g1] == [[0] * finished[s.index] for s in g1]
    assert all(s.loss_mask == [0] + [1] * (s.response_length - 1) and s.response_length > 1 for s in g2)


def test_mask_offpolicy_needs_partial_rollout():
    from miles_core.config import ConfigError
    from flows.recipes import load_config

    assert load_config("tiny", {"partial_rollout": True, "mask_offpolicy_in_partial_rollout": True}).rollout.mask_offpolicy_in_partial_rollout
    with pytest.raises(ConfigError, match="mask_offpolicy_in_partial_rollout applies to the groups partial_rollout buffers"):
        load_config("tiny", {"mask_offpolicy_in_partial_rollout": True})


FILTER_CALLS: list[tuple] = []


def newest_first(args, rollout_id, buffer, num_samples):
    """A buffer filter of the reference's form (its pop_first, newest end): removes what it returns."""
    FILTER_CALLS.append((args.partial_rollout if args is not None else None, rollout_id, len(buffer), num_samples))
    taken = buffer[-num_samples:][::-1]
    del buffer[-num_samples:]
    return taken


def test_buffer_filter_path_picks_the_buffered_groups_a_round_takes(engine, tiny_tokenizer):
    """buffer_filter_path (the reference's RolloutDataSourceWithBuffer: buffer_filter(args, None, buffer, n)): its
    groups are taken instead of the oldest; the runtime resolves it with the config as args; a filter that does not
    remove what it returns fails naming the field."""
    from flows.recipes import load_config
    from miles_core.runtime.placement import _data_source

    cfg = load_config("tiny", {"partial_rollout": True, "buffer_filter_path": f"{__name__}.newest_first"})
    source = _data_source(cfg, _prompts(tiny_tokenizer))
    spec = _spec(tiny_tokenizer, want=1, over=4, filter_path=None)
    FILTER_CALLS.clear()
    _run(engine, source, spec, tiny_tokenizer, 0)  # group 0 kept; 1, 2, 3 buffered
    assert _ids(source.buffer) == [1, 2, 3] and FILTER_CALLS == []  # an empty buffer: not called, as the reference
    r1 = _run(engine, source, replace(spec, over_sampling_batch_size=2), tiny_tokenizer, 1)
    assert FILTER_CALLS == [(True, None, 3, 2)] and _ids(r1.samples[::G]) == [3] and _ids(source.buffer) == [1, 2]
    default = DataSource(_prompts(tiny_tokenizer), shuffle=False, seed=0)  # no filter: the oldest first
    default.add_to_buffer([[s] for s in source.buffer[0]] + [source.buffer[1]])
    assert [g[0].group_index for g in default.take_buffered(1)] == [1]

    keeps = DataSource([], shuffle=False, seed=0, buffer_filter=lambda args, rid, buffer, n: buffer[:n])
    keeps.add_to_buffer([[s] for s in r1.samples])
    with pytest.raises(ValueError, match="buffer_filter_path .* must remove from the buffer"):
        keeps.take_buffered(1)
    with pytest.raises(Exception, match="buffer_filter_path applies to the groups partial_rollout buffers"):
        load_config("tiny", {"buffer_filter_path": f"{__name__}.newest_first"})

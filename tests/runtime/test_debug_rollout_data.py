"""The reference's debug dumps and one-sided runs on the local runtime (miles_core/runtime/debug_data.py):
save_debug_rollout_data writes the reference's payload, load_debug_rollout_data (+ _subsample) trains on it without an
engine, debug_rollout_only generates without training, ci_inject_rollout_data_* replaces a checked rollout."""

from __future__ import annotations

import json

import pytest
import torch

from flows.recipes import load_config
from miles_core.data import Sample
from miles_core.runtime.debug_data import check_injection, load_rollout, save_rollout

BASE = {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "rollout_max_response_len": 6, "rm_type": "deterministic_random",
        "lr": 1e-2, "num_threads": 1, "num_rollout": 2, "eval_prompt_data": None}


def _runtime(tmp_path, **over):
    from miles_core.runtime.placement import build_runtime

    return build_runtime(load_config("tiny", {**BASE, "run_dir": str(tmp_path / "run"), **over}))


def test_recorded_rollouts_are_trained_on_without_an_engine_and_rollout_only_never_trains(tmp_path):
    template = str(tmp_path / "dump" / "rollout_{rollout_id}.pt")
    rt = _runtime(tmp_path / "rec", save_debug_rollout_data=template, debug_rollout_only=True)
    try:
        w0 = torch.cat([t.flatten() for _, t in rt.trainer.named_tensors()]).clone()
        for i in range(2):
            assert rt.sync_weights() == {} and rt.weight_version == 0  # nothing trained, nothing sent
            rt.generate(i)
            assert rt.train(i).steps == [] and rt.save(i, {}) == {}
        assert torch.equal(torch.cat([t.flatten() for _, t in rt.trainer.named_tensors()]), w0)
        generated = rt.load_rollout(1)
    finally:
        rt.close()
    assert not (tmp_path / "rec" / "run" / "checkpoints").exists()
    payload = torch.load(tmp_path / "dump" / "rollout_1.pt", weights_only=True)
    assert payload["rollout_id"] == 1 and payload["metadata"] == {}
    assert [Sample.from_dict(d) for d in payload["samples"]] == generated  # the reference's {rollout_id, metadata, samples}

    rt = _runtime(tmp_path / "train", load_debug_rollout_data=template)
    try:
        assert rt.fleet.restarts == 0 and rt.sync_weights() == {}
        with pytest.raises(RuntimeError, match="no rollout engine"):
            rt.engine  # noqa: B018 - no engine was built
        rt.generate(1)
        assert rt.load_rollout(1) == generated
        out = rt.train(1)
    finally:
        rt.close()
    assert out.steps[0]["train/grad_norm"] > 0 and out.rollout["rollout/rollout_log_probs"] == pytest.approx(
        sum(sum(s.rollout_log_probs) for s in generated) / sum(sum(s.loss_mask) for s in generated), rel=1e-5)


def test_subsample_keeps_both_ends_and_the_count_must_match(tmp_path):
    samples = [Sample(group_index=i // 4, index=i, tokens=[1, 2, 3], response_length=1, loss_mask=[1], rollout_log_probs=[-0.5])
               for i in range(16)]
    template = str(tmp_path / "{rollout_id}.pt")
    save_rollout(template, samples, 0)
    assert [s.index for s in load_rollout(template, 0, 0.5)] == [0, 1, 2, 3, 12, 13, 14, 15]
    rt = _runtime(tmp_path, load_debug_rollout_data=template, load_debug_rollout_data_subsample=0.25)
    try:
        with pytest.raises(ValueError, match="holds 4 samples .*rollout_batch_size \\* n_samples_per_prompt = 8"):
            rt.generate(0)
    finally:
        rt.close()


def test_a_reference_dump_loads_and_a_field_miles_lacks_fails(tmp_path):
    ref = {"group_index": 0, "index": 0, "rollout_id": 0, "prompt": "p", "tokens": [5, 6, 7], "response": "x",
           "response_length": 1, "label": "1", "reward": 1.0, "loss_mask": [1], "weight_versions": ["3"],
           "rollout_log_probs": [-0.1], "status": "completed", "metadata": {}, "multimodal_inputs": None, "remove_sample": False,
           "spec_info": {"spec_accept_token_num": 0}, "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 0}}
    torch.save({"rollout_id": 0, "metadata": {}, "samples": [ref]}, tmp_path / "0.pt")
    (s,) = load_rollout(str(tmp_path / "{rollout_id}.pt"), 0)
    assert s.weight_versions == [3] and s.tokens == [5, 6, 7] and s.status == Sample.Status.COMPLETED
    torch.save({"rollout_id": 1, "metadata": {}, "samples": [{**ref, "remove_sample": True}]}, tmp_path / "1.pt")
    with pytest.raises(ValueError, match="sample 0 sets remove_sample=True"):
        load_rollout(str(tmp_path / "{rollout_id}.pt"), 1)


def test_trajectories_go_to_their_jsonl(tmp_path):
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    samples = [Sample(index=0, tokens=[1, 2], response_length=1, metadata={"messages": chat}), Sample(index=1, tokens=[1, 3], response_length=1)]
    save_rollout(str(tmp_path / "r{rollout_id}.pt"), samples, 7, str(tmp_path / "t{rollout_id}.jsonl"))
    rows = [json.loads(line) for line in (tmp_path / "t7.jsonl").read_text().splitlines()]
    assert [(r["sample_index"], r["messages"]) for r in rows] == [(0, chat)]
    assert torch.load(tmp_path / "r7.pt", weights_only=True)["samples"][0]["metadata"] == {}  # moved out of the .pt
    assert samples[0].metadata["messages"] == chat  # the run's own samples keep them


def test_injection_pairs_the_batches_and_bounds_the_match(tmp_path):
    def s(prompt, response):
        return Sample(tokens=prompt + response, response_length=len(response))

    gen = [s([1, 2], [3, 4, 5, 6]), s([1, 9], [3, 4])]
    assert check_injection(gen, [s([1, 2], [3, 4, 5, 0]), s([1, 9], [3, 4])], 2, 0.8) == pytest.approx((0.75 + 1) / 2)
    with pytest.raises(AssertionError, match="match the recording at 0.6250, not above .* 0.9"):
        check_injection(gen, [s([1, 2], [3, 4, 5, 0]), s([1, 9], [3, 0])], 2, 0.9)
    with pytest.raises(AssertionError, match="sample 1: the prompt tokens differ"):
        check_injection(gen, [s([1, 2], [3, 4, 5, 6]), s([1, 8], [3, 4])], 2, 0.9)


def test_injected_rollouts_replace_the_generated_ones_from_the_start_id(tmp_path):
    """Run a records rollout 0; run b (same seed, same loaded weights) generates it again, checks it against a copy of
    the recording with other rewards, and trains on that copy."""
    recorded = str(tmp_path / "rec" / "{rollout_id}.pt")
    injected = str(tmp_path / "inj" / "{rollout_id}.pt")
    rt = _runtime(tmp_path / "a", save_debug_rollout_data=recorded, debug_rollout_only=True)
    try:
        rt.generate(0)
    finally:
        rt.close()
    save_rollout(injected, [Sample.from_dict({**x.to_dict(), "reward": 0.5}) for x in load_rollout(recorded, 0)], 0)
    rt = _runtime(tmp_path / "b", ci_inject_rollout_data_path=injected, ci_inject_rollout_data_start_rollout_id=0,
                  debug_rollout_only=True)
    try:
        rt.generate(0)
        assert {s.reward for s in rt.load_rollout(0)} == {0.5}  # the recording's samples are what rollout 0 trains on
        assert [s.tokens for s in rt.load_rollout(0)] == [s.tokens for s in load_rollout(recorded, 0)]
    finally:
        rt.close()


@pytest.mark.parametrize("over, match", [
    ({"debug_train_only": True}, "debug_train_only runs without rollout engines"),
    ({"debug_rollout_only": True, "load_debug_rollout_data": "x/{rollout_id}.pt"}, "cannot be set together"),
    ({"load_debug_rollout_data": "x/{rollout_id}.pt", "eval_prompt_data": ["arith", "builtin://arith"]}, "no engines to evaluate"),
    ({"debug_rollout_only": True, "eval_prompt_data": ["arith", "builtin://arith"]}, "weight_version stays 0"),
    ({"load_debug_rollout_data": "x/{id}.pt"}, "not a path template of {rollout_id}"),
    ({"load_debug_rollout_data_subsample": 0.5}, "set load_debug_rollout_data"),
    ({"save_debug_trajectory_data": "t/{rollout_id}.jsonl"}, "set save_debug_rollout_data too"),
    ({"save_debug_rollout_data": "d/{rollout_id}.pt", "eval_prompt_data": ["arith", "builtin://arith"]}, "eval samples"),
    ({"ci_inject_rollout_data_path": "d/{rollout_id}.pt"}, "go together"),
    ({"load_debug_rollout_data": "x/{rollout_id}.pt", "runtime": "ray"}, "supported with runtime local"),
])
def test_debug_options_are_checked_at_load(over, match):
    with pytest.raises(ValueError, match=match):
        load_config("tiny", {**BASE, **over})

"""The rollout's generation metrics (the reference's log_rollout_data, miles/ray/rollout/metrics.py), local placement:
log_reward_category's rollout/error_cat/<c>, and custom_rollout_log_function_path called with the reference's
signature, whose True drops the default metrics."""

from __future__ import annotations

import pytest

from flows.recipes import load_config

BASE = {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "rollout_max_response_len": 4, "num_threads": 1,
        "num_rollout": 1, "eval_prompt_data": None, "custom_rm_path": "tests.runtime.test_generation_metrics.category_rm",
        "reward_key": "score"}
CALLS: list[tuple] = []


async def category_rm(args, sample):
    """Samples 0, 1, 2 of every 4 are 'wrong_format', the 4th 'ok' (rewarded)."""
    return {"score": float(sample.index % 4 == 3), "cat": "ok" if sample.index % 4 == 3 else "wrong_format"}


def log_and_skip(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
    CALLS.append((rollout_id, args.rollout_batch_size, len(samples), dict(rollout_extra_metrics or {}), rollout_time))
    return True


def log_and_keep(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
    CALLS.append((rollout_id,))
    return False


def _metrics(tmp_path, **over) -> dict:
    from miles_core.runtime.placement import build_runtime

    rt = build_runtime(load_config("tiny", {**BASE, **over, "run_dir": str(tmp_path / "run")}))
    try:
        rt.sync_weights()
        return rt.generate(0)
    finally:
        rt.close()


def test_log_reward_category_and_the_custom_rollout_log_function(tmp_path):
    m = _metrics(tmp_path / "cat", log_reward_category="cat")
    assert m["rollout/error_cat/wrong_format"] == pytest.approx(0.75) and m["rollout/error_cat/ok"] == pytest.approx(0.25)
    assert m["rollout/raw_reward"] == pytest.approx(0.25)
    assert not any(k.startswith("rollout/error_cat/") for k in _metrics(tmp_path / "none"))  # off by default

    CALLS.clear()
    assert _metrics(tmp_path / "skip", custom_rollout_log_function_path="tests.runtime.test_generation_metrics.log_and_skip") == {}
    [(rollout_id, batch_size, n, extra, seconds)] = CALLS
    assert (rollout_id, batch_size, n) == (0, 2, 8) and seconds > 0
    CALLS.clear()
    kept = _metrics(tmp_path / "keep", custom_rollout_log_function_path="tests.runtime.test_generation_metrics.log_and_keep")
    assert CALLS == [(0,)] and kept["rollout/raw_reward"] == pytest.approx(0.25) and "perf/rollout_time" in kept


def test_a_non_dict_reward_with_log_reward_category_fails_naming_it(tmp_path):
    with pytest.raises(ValueError, match="log_reward_category='cat': every reward must be a dict"):
        _metrics(tmp_path, log_reward_category="cat", custom_rm_path=None, reward_key=None, rm_type="deterministic_random")


def drop_rewarded(args, data):
    """A rollout sample filter of the reference's form: marks the rewarded sample of every group."""
    CALLS.append((args.n_samples_per_prompt, [len(g) for g in data]))
    for group in data:
        for s in group:
            s.remove_sample = s.reward["score"] == 1.0


def test_rollout_sample_filter_path_zeroes_the_loss_mask_of_removed_samples(tmp_path):
    """rollout_sample_filter_path (the reference's fn(args, data) in sglang_rollout / fully_async_rollout, applied to the
    loss mask by train_data_conversion.py): called with the rollout's groups; a removed sample's loss mask is all 0 in
    the rollout file the trainer reads, the others' unchanged; the rollout metrics still count every sample."""
    from miles_core.runtime.placement import build_runtime

    CALLS.clear()
    rt = build_runtime(load_config("tiny", {**BASE, "run_dir": str(tmp_path / "run"),
                                            "rollout_sample_filter_path": f"{__name__}.drop_rewarded"}))
    try:
        rt.sync_weights()
        m = rt.generate(0)
        samples = rt.load_rollout(0)
    finally:
        rt.close()
    assert CALLS == [(4, [4, 4])] and m["rollout/raw_reward"] == pytest.approx(0.25)
    removed = [s for s in samples if s.reward["score"] == 1.0]
    assert len(removed) == 2 and all(s.loss_mask == [0] * s.response_length and s.response_length > 0 for s in removed)
    assert all(s.loss_mask == [1] * s.response_length for s in samples if s not in removed)

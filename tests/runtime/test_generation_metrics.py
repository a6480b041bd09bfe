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

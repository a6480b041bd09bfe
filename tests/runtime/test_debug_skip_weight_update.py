"""debug_skip_weight_update (the reference's --debug-skip-weight-update), local placement: no sync reaches the engine,
which keeps generating with the weights it loaded while the trainer moves."""

from __future__ import annotations

import pytest

from flows.recipes import load_config

BASE = {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "rollout_max_response_len": 6, "rm_type": "deterministic_random",
        "lr": 1e-2, "num_threads": 1, "num_rollout": 2, "eval_prompt_data": None}


def _rollouts(tmp_path, **over):
    """sync, generate + train rollout 0, sync, generate + train rollout 1 -> (versions served, trainer-vs-engine diff at 1)."""
    from miles_core.runtime.placement import build_runtime

    rt = build_runtime(load_config("tiny", {**BASE, **over, "run_dir": str(tmp_path / "run")}))
    try:
        versions, diff = [], None
        for i in range(2):
            rt.sync_weights()
            rt.generate(i)
            versions.append({s.weight_versions[0] for s in rt.load_rollout(i)})
            diff = rt.train(i).steps[0]["train/train_rollout_logprob_abs_diff"]
        return versions, diff
    finally:
        rt.close()


def test_the_engine_keeps_its_loaded_weights(tmp_path):
    versions, diff = _rollouts(tmp_path / "skip", debug_skip_weight_update=True)
    assert versions == [{0}, {0}] and diff > 1e-3  # rollout 1 came from the loaded weights, the trainer had moved
    versions, diff = _rollouts(tmp_path / "sync")
    assert versions == [{1}, {2}] and diff < 1e-4  # the control: each rollout from the trainer's weights


def test_with_eval_it_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="debug_skip_weight_update with eval datasets is not supported yet"):
        load_config("tiny", {**BASE, "debug_skip_weight_update": True, "eval_prompt_data": ["arith", "builtin://arith"]})

"""check_weight_update_equal (and ci_test, which turns it on) on the local runtime: the first sync of a fresh run must
rewrite every parameter of the scrambled in-process engine; a weight source that misses a tensor fails naming it."""

from __future__ import annotations

import pytest

from flows.recipes import load_config
from miles_core.rollout.weight_checker import WeightCheckError

BASE = {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "rollout_max_response_len": 6, "rm_type": "deterministic_random",
        "num_threads": 1, "num_rollout": 2, "eval_prompt_data": None}


class Missing:
    """The trainer's weights without one tensor (a sync with a gap)."""

    def __init__(self, inner, name: str):
        self.inner, self.name = inner, name

    def tensors(self):
        return ((n, t) for n, t in self.inner.tensors() if n != self.name)


def _first_sync(tmp_path, missing: str | None = None, **over):
    from miles_core.runtime.placement import build_runtime

    rt = build_runtime(load_config("tiny", {**BASE, "run_dir": str(tmp_path / "run"), **over}))
    try:
        if missing is not None:
            rt.weights = Missing(rt.weights, missing)
        rt.sync_weights()
        return dict(rt.engine.model.named_parameters())
    finally:
        rt.close()


def test_a_sync_that_misses_a_tensor_fails_and_a_whole_one_passes(tmp_path):
    params = _first_sync(tmp_path / "ok", check_weight_update_equal=True)
    name = next(n for n in params if ".layers.0." in n and n.endswith("q_proj.weight"))
    with pytest.raises(WeightCheckError, match=f"1 of {len(params)} parameters differ .*{name}"):
        _first_sync(tmp_path / "gap", missing=name, ci_test=True)  # ci_test turns the check on
    _first_sync(tmp_path / "skip", missing=name, check_weight_update_equal=True, check_weight_update_skip_list=["q_proj"])
    _first_sync(tmp_path / "off", missing=name, ci_test=True, ci_disable_weight_update_checker=True)  # not checked


@pytest.mark.parametrize("over, match", [
    ({"check_weight_update_selector": "draft", "check_weight_update_equal": True}, "serve no draft"),
    ({"check_weight_update_skip_list": ["x"]}, "shape the weight-update check, which is off"),
    ({"check_weight_update_equal": True, "debug_rollout_only": True}, "send none"),
    ({"ci_disable_weight_update_checker": True}, "act only with ci_test"),
])
def test_weight_check_options_are_checked_at_load(over, match):
    with pytest.raises(ValueError, match=match):
        load_config("tiny", {**BASE, **over})

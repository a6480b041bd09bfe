"""`extends:` in a recipe: a scale variant starts from its base recipe's values."""

from __future__ import annotations

import pytest

from miles_core.config import ConfigError
from flows.recipes import load_config


def test_debug_scale_keeps_the_recipes_algorithm_and_changes_the_scale():
    full, debug = load_config("glm4-5"), load_config("glm4-5-debug")
    assert (full.cluster.runtime, full.cluster.train_backend, full.cluster.rollout_engine) == ("ray", "megatron", "sglang")
    assert (debug.cluster.runtime, debug.cluster.train_backend, debug.cluster.rollout_engine) == ("local", "torch", "hf")
    assert debug.algo == full.algo  # estimator, clip, TIS, KL, optimizer: the recipe's
    assert debug.rollout.rm_type == full.rollout.rm_type and debug.rollout.rollout_temperature == full.rollout.rollout_temperature
    assert debug.misc.recipe == "glm4-5-debug" and debug.checkpoint.hf_checkpoint == "builtin://glm4-5-debug"
    assert debug.n_samples == debug.global_batch_size * debug.num_steps_per_rollout  # 2 x 4 = 2 x 4


def test_extends_relative_path_and_cycles(tmp_path):
    (tmp_path / "base.yaml").write_text("extends: tiny\nrollout_batch_size: 4\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\nlr: 3.0e-4\n")
    cfg = load_config(str(tmp_path / "child.yaml"))
    assert (cfg.rollout.rollout_batch_size, cfg.algo.lr, cfg.misc.recipe, cfg.data.prompt_data) == (4, 3e-4, "child", "builtin://arith")
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match="extends cycle"):
        load_config(str(tmp_path / "a.yaml"))

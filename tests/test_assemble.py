"""miles_core/assemble.py: the registry checks of a loaded config, split from config's pure rules, run by the
CLI (flows/recipes.py) and by the train flow itself (a deployment run's parameters skip the CLI)."""

from __future__ import annotations

import pytest

from miles_core import assemble
from miles_core.config import ConfigError, loader

BASE = {"prompt_data": "builtin://arith", "rollout_batch_size": 2, "n_samples_per_prompt": 2}


@pytest.mark.parametrize("extra, field", [
    ({"rm_type": "no_such_rm"}, "no_such_rm"),
    ({"loss_type": "custom_loss", "custom_loss_function_path": "no.such.loss"}, "custom_loss_function_path"),
    ({"dynamic_sampling_filter_path": "no_such_filter"}, "dynamic_sampling_filter_path"),
    ({"custom_generate_function_path": "no.such.generate"}, "no.such.generate"),
])
def test_the_pure_rules_pass_and_the_registry_check_names_the_field(extra, field):
    cfg = loader.build_config({**BASE, **extra})  # schemas and pure rules only: config imports no registry
    with pytest.raises(ConfigError, match=field) as e:
        assemble.check(cfg, "recipe x")
    assert str(e.value).startswith("recipe x: invalid config:\n  - config: ")
    with pytest.raises(ConfigError, match=field):
        assemble.build_config({**BASE, **extra})


def test_the_recipes_dir_is_the_callers(tmp_path):
    from flows.recipes import RECIPES_DIR, list_recipes

    (tmp_path / "mine.yaml").write_text("extends: tiny.yaml\nrollout_batch_size: 2\n")
    (tmp_path / "tiny.yaml").write_text((RECIPES_DIR / "tiny.yaml").read_text())
    cfg = assemble.load_config("mine", {"num_rollout": 1}, recipes_dir=tmp_path)
    assert (cfg.rollout.rollout_batch_size, cfg.misc.recipe) == (2, "mine")
    assert loader.list_recipes(tmp_path) == ["mine", "tiny"] and "tiny" in list_recipes()
    with pytest.raises(ConfigError, match=r"unknown recipe 'tiny-qwen'.*\['mine', 'tiny'\]"):
        loader.load_config("tiny-qwen", recipes_dir=tmp_path)


def test_the_train_flow_checks_a_config_that_skipped_the_cli():
    """A deployment run's form is validated by Prefect with the schema's pure rules only: the flow runs the
    registry checks first, before preflight, the run lock or any model."""
    from flows.train import train

    cfg = loader.build_config({**BASE, "rm_type": "no_such_rm"})
    with pytest.raises(ConfigError, match="(?s)flow parameter config: invalid config:.*no_such_rm"):
        train.fn(cfg)

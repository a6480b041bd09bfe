"""The CLI exposes every config field as a kebab-case flag and reports bad input cleanly."""

from __future__ import annotations

from typer.testing import CliRunner

from flows.cli import app, parse_overrides
from miles_core.config import field_groups

runner = CliRunner()


def test_every_field_is_a_flag():
    result = runner.invoke(app, ["config", "--help"], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
    assert result.exit_code == 0
    missing = [n for n in field_groups() if "--" + n.replace("_", "-") not in result.output]
    assert not missing, missing


def test_flag_overrides_recipe_value():
    result = runner.invoke(app, ["config", "tiny", "--rollout-batch-size", "4", "--colocate", "--eval-prompt-data", "a p b q"])
    assert result.exit_code == 0, result.output
    assert "rollout_batch_size: 4" in result.output
    assert "colocate: true" in result.output
    assert "- q" in result.output


def test_a_list_field_without_none_takes_a_space_separated_value_too():
    """list[Literal[...]] fields (offload_rollout_level, profile_target) split as list[str] | None ones do."""
    out = parse_overrides({"offload_rollout_level": "kv_cache weight", "profile_target": "train_actor train_log_probs"})
    assert out == {"offload_rollout_level": ["kv_cache", "weight"], "profile_target": ["train_actor", "train_log_probs"]}


def test_broken_invariant_is_a_clean_error():
    result = runner.invoke(app, ["config", "tiny", "--global-batch-size", "7"])
    assert result.exit_code == 2
    assert "global_batch_size" in result.output and "Traceback" not in result.output


def test_parse_overrides_types():
    out = parse_overrides({"lr": "1.0e-5", "num_rollout": "3", "rollout_stop": "a b", "colocate": None, "recipe": "x"})
    assert out == {"lr": 1e-5, "num_rollout": 3, "rollout_stop": ["a", "b"], "recipe": "x"}

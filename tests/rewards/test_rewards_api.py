"""The public API of miles_core.rewards: names, validation, options, score, reward_value."""

from __future__ import annotations

import dataclasses

import pytest

import miles_core.rewards as rewards
from miles_core.rewards import RM_TYPES, RewardOptions, reward_value, score, validate_rm_type


def test_public_names_are_exactly_the_api():
    assert sorted(rewards.__all__) == sorted([
        "RM_TYPES", "RewardOptions", "async_rm", "batched_async_rm", "load_function",
        "reward_value", "score", "validate_rm_type"])


def test_rm_types_are_the_registered_families():
    assert RM_TYPES == ("math", "deepscaler", "gemma_math", "dapo", "f1", "gpqa", "random",
                        "deterministic_random", "remote_rm")


@pytest.mark.parametrize("name", [*RM_TYPES, *(f"boxed_{t}" for t in RM_TYPES)])
def test_validate_accepts_every_type_and_its_boxed_form(name):
    validate_rm_type(name)


@pytest.mark.parametrize("name", ["mth", "boxed_", "boxed_nope", "boxed_boxed_math", "", "MATH", None, 3])
def test_validate_rejects_unknown_names_with_the_valid_list(name):
    with pytest.raises(ValueError) as err:
        validate_rm_type(name)
    message = str(err.value)
    assert repr(name) in message
    assert all(t in message for t in RM_TYPES)


def test_options_defaults_and_frozen():
    opts = RewardOptions()
    assert (opts.rm_type, opts.custom_rm_path, opts.rm_url, opts.group_rm, opts.reward_key,
            opts.custom_reward_post_process_path, opts.rm_timeout, opts.rm_max_retries) == (
        "math", None, None, False, None, None, 30.0, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.rm_type = "f1"


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"rm_type": "nope"}, "'nope'"),
    ({"group_rm": True}, "custom_rm_path"),
    ({"rm_type": "remote_rm"}, "rm_url"),
    ({"rm_type": "boxed_remote_rm"}, "rm_url"),
    ({"rm_timeout": 0}, "rm_timeout"),
    ({"rm_max_retries": -1}, "rm_max_retries"),
])
def test_options_reject_inconsistent_settings(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        RewardOptions(**kwargs)


def test_score_math_and_unknown_type():
    assert score("math", r"\boxed{\frac12}", "0.5") == 1.0
    with pytest.raises(ValueError, match="unknown rm_type 'bogus'"):
        score("bogus", "x", "y")


def test_score_metadata_rm_type_overrides_argument():
    assert score("math", "Paris", "Paris", {"rm_type": "f1"}) == 1.0
    with pytest.raises(ValueError, match="metadata\\['rm_type'\\].*'nope'"):
        score("math", "x", "x", {"rm_type": "nope"})


def test_score_remote_rm_needs_a_url():
    with pytest.raises(ValueError, match="rm_url"):
        score("remote_rm", "x", "y")


def test_dapo_returns_the_documented_dict():
    expected = {"score": 1.0, "acc": True, "pred": "\\frac{1}{2}"}
    assert score("dapo", "Answer: $\\frac{1}{2}$", "0.5") == expected
    assert score("dapo", "nothing", "0.5") == {"score": -1.0, "acc": False, "pred": ""}


def test_reward_value_numbers_and_dicts():
    assert reward_value(1, None) == 1.0 and isinstance(reward_value(1, None), float)
    assert reward_value(0.25, "score") == 0.25  # the key only applies to dict rewards
    assert reward_value({"score": -1.0, "acc": False}, "score") == -1.0
    assert reward_value({"acc": True}, "acc") == 1.0


def test_reward_value_errors_name_the_key_and_the_available_keys():
    with pytest.raises(ValueError, match=r"reward_key.*\['acc', 'pred', 'score'\]"):
        reward_value({"score": 1.0, "acc": True, "pred": "1"}, None)
    with pytest.raises(ValueError, match=r"'points'.*\['acc', 'score'\]"):
        reward_value({"score": 1.0, "acc": True}, "points")
    with pytest.raises(TypeError, match="'pred'"):
        reward_value({"pred": "1"}, "pred")
    with pytest.raises(TypeError, match="None"):
        reward_value(None, None)

"""Shipped recipes against the reference launchers they claim to follow, setting by setting (the fields we
have; tests/fixtures/reference/launchers.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from miles_core.config import field_groups
from flows.recipes import load_config

LAUNCHERS = yaml.safe_load((Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "launchers.yaml").read_text())
# the reference names built-ins by their module path; ours by their registry name
REGISTRY_NAME = {"dynamic_sampling_filter_path": lambda v: v.rsplit(".", 1)[-1]}


def _value(cfg, name):
    return getattr(getattr(cfg, field_groups()[name]), name)


@pytest.mark.parametrize("recipe", sorted(LAUNCHERS))
def test_recipe_follows_its_reference_launcher(recipe):
    cfg = load_config(recipe)
    recipe_text = (Path(__file__).resolve().parents[2] / "deployments" / "recipes" / f"{recipe}.yaml").read_text()
    assert LAUNCHERS[recipe]["launcher"].split()[0] in recipe_text, "the recipe names the launcher it follows"
    wrong = {}
    for name, reference in LAUNCHERS[recipe]["settings"].items():
        reference = REGISTRY_NAME.get(name, lambda v: v)(reference)
        expected = _value(load_config(recipe, {name: reference}), name)  # the reference value, parsed by our field
        if _value(cfg, name) != expected:
            wrong[name] = {"recipe": _value(cfg, name), "reference": expected}
    assert not wrong, f"{recipe} differs from {LAUNCHERS[recipe]['launcher']}: {wrong}"

"""The shipped recipes (deployments/recipes/*.yaml): the one place that names the directory.

The library's loader takes the recipes directory as an argument (miles_core/config lies below
deployments/); the CLI, the flows, the tools and the tests look recipes up through these.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from miles_core import assemble
from miles_core.config import TrainConfig, loader

RECIPES_DIR = Path(__file__).resolve().parents[1] / "deployments" / "recipes"


def list_recipes() -> list[str]:
    return loader.list_recipes(RECIPES_DIR)


def recipe_path(recipe: str) -> Path:
    return loader.recipe_path(recipe, RECIPES_DIR)


def read_recipe(recipe: str) -> dict[str, Any]:
    return loader.read_recipe(recipe, RECIPES_DIR)


def load_config(recipe: str, overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    """A recipe (name or YAML path) with overrides on top: the pure rules and the registry checks passed."""
    return assemble.load_config(recipe, overrides, recipes_dir=RECIPES_DIR)

"""The layer rules of miles_core over its import graph (tools/layers.py: AST, module- and function-level imports,
relative ones resolved): imports point down the tiers, config imports nothing else of the library, no import
cycle of more than one module, no prefect in the library and mlflow only in tracking/."""

from __future__ import annotations

from tools import layers


def test_every_package_has_a_tier_and_every_tier_names_a_package():
    packages = {layers.package(m) for m in layers.modules()} - {layers.LIBRARY}
    tiered = {p for tier in layers.TIERS for p in tier}
    assert packages == tiered, f"untiered: {sorted(packages - tiered)}; gone: {sorted(tiered - packages)}"


def test_imports_point_down_the_tiers():
    assert [v for v in layers.layer_violations() if "imports point down" in v] == []


def test_config_imports_nothing_else_of_miles_core():
    """config is data: schemas and pure rules (the registry checks are miles_core/assemble.py's)."""
    up = [imp for imp in layers.all_imports() if layers.package(imp.importer) == "config"
          and imp.target.startswith("miles_core.") and layers.package(imp.target) != "config"]
    assert up == []


def test_nothing_in_the_library_calls_assemble():
    assert [imp.importer for imp in layers.all_imports() if imp.target == "miles_core.assemble"] == []


def test_no_import_cycle_of_more_than_one_module():
    assert layers.cycles() == []


def test_no_prefect_in_miles_core_and_mlflow_only_in_tracking():
    roots = {(layers.package(imp.importer), imp.target.split(".")[0]) for imp in layers.all_imports()}
    assert {pkg for pkg, root in roots if root == "prefect"} == set()
    assert {pkg for pkg, root in roots if root == "mlflow"} <= {"tracking"}
    assert [v for v in layers.layer_violations() if "prefect" in v or "mlflow" in v or "above the library" in v] == []


def test_the_checker_sees_function_level_and_relative_imports():
    """The graph is what the rules stand on: a lazy import inside a function and a relative one are edges."""
    g = layers.graph()
    assert "miles_core.rollout.multi_turn.calls" in g["miles_core.rollout.multi_turn.front"]  # from .calls import (module level)
    assert "miles_core.models.tiny_tools" in g["miles_core.models.catalog"]  # from .tiny_tools import, inside a function
    assert "miles_core.config.train" not in g["miles_core.config.rules"]  # under TYPE_CHECKING: not a run-time edge
    assert "miles_core.config.train" in layers.graph(type_checking=True)["miles_core.config.rules"]


def test_the_architecture_page_lists_the_tiers():
    import re

    page = (layers.ROOT / "docs" / "developer" / "architecture.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", page, re.M)
    assert [tuple(re.findall(r"`(\w+)`", pkgs)) for _, pkgs in rows] == list(layers.TIERS)

"""miles_core.algorithms stays pure: torch, pydantic, yaml and the stdlib, the config package and the dotted-path
resolver only (every import, module or function level, relative ones resolved: tools/layers.py; the tiers of
every package: tests/test_layers.py)."""

from __future__ import annotations

from tools import layers

ALLOWED_ROOTS = {"__future__", "collections", "dataclasses", "functools", "importlib", "inspect", "math", "types", "typing",
                 "torch", "pydantic", "yaml", "miles_core"}
ALLOWED_OURS = ("config", "algorithms", "resolve")


def test_imports_are_light():
    for module in layers.modules():
        if layers.package(module) != "algorithms":
            continue
        for imp in layers.imports_of(module):
            assert imp.target.split(".")[0] in ALLOWED_ROOTS, f"{module} imports {imp.target}"
            if imp.target.startswith("miles_core."):
                assert layers.package(imp.target) in ALLOWED_OURS, f"{module} imports {imp.target}"

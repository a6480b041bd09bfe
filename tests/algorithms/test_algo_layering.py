"""miles_core.algorithms stays pure: torch, pydantic, yaml, the config package and the dotted-path resolver only."""

from __future__ import annotations

import ast
from pathlib import Path

import miles_core.algorithms as algorithms

ALLOWED_ROOTS = {"__future__", "collections", "dataclasses", "functools", "importlib", "inspect", "math", "types", "typing",
                 "torch", "pydantic", "yaml", "miles_core"}


def test_imports_are_light():
    root = Path(algorithms.__file__).parent
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in ALLOWED_ROOTS, f"{path.name} imports {name}"
                if name.startswith("miles_core."):
                    assert name.startswith(("miles_core.config", "miles_core.algorithms", "miles_core.resolve")), f"{path.name} imports {name}"

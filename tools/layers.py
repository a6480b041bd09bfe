"""The import graph of miles_core, read from the source (AST: module-level and function-level imports, relative
ones resolved), and the layer rules it must keep (docs/developer/architecture.md, "Layers").

    python -m tools.layers          # the violations, one a line (exit 1 if any)
    python -m tools.layers --graph  # package -> the miles_core packages it imports

Rules:
- ``TIERS``: each miles_core package (or top-level module) sits in one tier; it imports its own package and
  packages of lower tiers only ("imports point down"). ``config`` is in the bottom tier: config is data.
  ``assemble`` is the top: nothing in the library calls it (the CLI and the flows do).
- no cycle of more than one module inside miles_core (imports under ``if TYPE_CHECKING:`` never run and are
  left out of the cycle check; they count for the tiers);
- ``FORBIDDEN``: third-party roots a part may not import (prefect nowhere in miles_core; mlflow only in
  miles_core/tracking/), and the layers above the library (flows, tasks, tools, deployments).
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = "miles_core"

# bottom first; a package imports only packages of lower tiers (and itself)
TIERS: tuple[tuple[str, ...], ...] = (
    ("config", "resolve", "env", "device", "malloc", "faults", "finite", "data", "tracking", "weights"),  # data and bottom-floor utilities
    ("algorithms", "rewards", "models", "runlock"),  # the math, the reward families, model builders: pure libraries
    ("checkpoint",),
    ("rollout",),
    ("specs", "training"),
    ("evaluation",),
    ("preflight",),
    ("runtime",),
    ("reference_import",),  # a reference launch command read and placed flag by flag (`miles recipe import`)
    ("assemble",),  # the registry checks of a loaded config, for flows/ and the CLI
)
ABOVE_LIBRARY = ("flows", "tasks", "tools", "deployments", "tests", "bench")
# (package, or "" for all of miles_core) -> import roots it may not use, and why
FORBIDDEN: dict[str, dict[str, str]] = {
    "": {"prefect": "miles_core never imports prefect (the flows and tasks do)",
         **{top: f"{top}/ lies above the library" for top in ABOVE_LIBRARY}},
}
ONLY_IN: dict[str, str] = {"mlflow": "tracking"}  # a third-party root -> the one package that may import it


@dataclass(frozen=True)
class Import:
    importer: str  # the importing module, dotted (miles_core.config.rules)
    target: str  # the imported name, dotted, resolved to a module of ours where it names one
    line: int
    type_checking: bool  # under `if TYPE_CHECKING:`


@lru_cache(maxsize=1)
def modules() -> dict[str, tuple[Path, bool]]:
    """dotted module name -> (file, is a package __init__) for every module of miles_core."""
    out = {}
    for path in sorted((ROOT / LIBRARY).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _absolute(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _ours(name: str) -> str:
    """``name`` cut down to the longest module of ours it starts with (a name imported from a module -> that module)."""
    mods = modules()
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name


def imports_of(module: str) -> Iterator[Import]:
    path, is_pkg = modules()[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    tc = _type_checking_lines(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_pkg, node)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules() else base for a in node.names]
        else:
            continue
        for name in names:
            yield Import(module, _ours(name) or name, node.lineno, node.lineno in tc)


def package(module: str) -> str:
    """miles_core.config.rules -> config; miles_core.resolve -> resolve; a third-party name -> its root."""
    parts = module.split(".")
    return parts[1] if parts[0] == LIBRARY and len(parts) > 1 else parts[0]  # miles_core itself (an empty __init__): its own


def tier_of(pkg: str) -> int:
    if pkg == LIBRARY:  # miles_core/__init__.py, empty: below everything
        return 0
    for i, tier in enumerate(TIERS):
        if pkg in tier:
            return i
    raise KeyError(f"miles_core.{pkg} has no tier in tools/layers.py TIERS: place it (docs/developer/architecture.md)")


def all_imports() -> list[Import]:
    return [imp for m in modules() for imp in imports_of(m)]


def layer_violations() -> list[str]:
    out = []
    for imp in all_imports():
        src, where = package(imp.importer), f"{modules()[imp.importer][0].relative_to(ROOT)}:{imp.line}"
        if imp.target.startswith(LIBRARY + ".") or imp.target == LIBRARY:
            dst = package(imp.target)
            if dst != src and tier_of(dst) >= tier_of(src):
                out.append(f"{where}: {src} (tier {tier_of(src)}) imports {imp.target} ({dst}, tier {tier_of(dst)}): "
                           "imports point down only")
            continue
        root = imp.target.split(".")[0]
        why = FORBIDDEN[""].get(root) or FORBIDDEN.get(src, {}).get(root)
        if why:
            out.append(f"{where}: imports {imp.target}: {why}")
        if root in ONLY_IN and src != ONLY_IN[root]:
            out.append(f"{where}: imports {imp.target}: only miles_core/{ONLY_IN[root]}/ may import {root}")
    return list(dict.fromkeys(out))  # one line per import statement (``from x import a, b`` is one)


def graph(type_checking: bool = False) -> dict[str, set[str]]:
    """module -> the modules of ours it imports (without itself; imports under TYPE_CHECKING when asked)."""
    out: dict[str, set[str]] = {m: set() for m in modules()}
    for imp in all_imports():
        if imp.target in modules() and imp.target != imp.importer and (type_checking or not imp.type_checking):
            out[imp.importer].add(imp.target)
    return out


def cycles() -> list[list[str]]:
    """Strongly connected sets of more than one module (Tarjan), each sorted; the run-time graph."""
    g, index, low, stack, on, found = graph(), {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while (w := stack.pop()) != v:
                on.discard(w)
                scc.append(w)
            on.discard(v)
            if scc:
                found.append(sorted([v, *scc]))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.layers", description=__doc__.splitlines()[0])
    p.add_argument("--graph", action="store_true", help="print package -> the packages it imports")
    args = p.parse_args(argv)
    if args.graph:
        pk: dict[str, set[str]] = {}
        for a, bs in graph(type_checking=True).items():
            pk.setdefault(package(a), set()).update(package(b) for b in bs if package(b) != package(a))
        for a in sorted(pk, key=lambda x: (tier_of(x), x)):
            print(f"{a} (tier {tier_of(a)}) -> {', '.join(sorted(pk[a])) or '-'}")
        return 0
    problems = layer_violations() + [f"import cycle: {' <-> '.join(c)}" for c in cycles()]
    print("\n".join(problems) or "layers ok")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())

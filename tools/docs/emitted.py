"""The metric names the code can emit, by a static scan of the code (no run needed).

Two kinds of emitters:

1. Prefixed keys: string literals and f-strings that start with a metric prefix
   (``"rollout/raw_reward"``, ``f"rollout/zero_std/count_{r}"``, ``f"{key}-pass@{k}"`` with
   ``key = f"eval/{ds.name}"`` in the same function). An f-string part becomes ``<>``. A bare
   pass-through (``f"train/{k}"``, ``f"rollout/{k}"``: re-prefixing the names of 2.) is skipped.
2. Bare names returned by the algorithm modules and the critic (REFERENCE: the trainer adds the
   prefix): keys of dict displays, ``metrics["x"] = ...`` stores and ``dict(..., x=...)`` keywords
   in ``BARE_MODULES`` (stores only into a dict whose name says metrics: ``metrics``, ``totals``);
   module-level UPPER_CASE dicts are name tables, not metrics, and so is a dict display subscripted where
   it stands (``{"none": a, "union": b}[mode]``: a choice, not a result).

Not keys: docstrings, arguments of ``startswith`` and friends (a prefix tested), strings with a space,
file names (``eval/samples_step_<>.json``).

The result is a set of normalized templates (placeholder names dropped: ``eval/<>-pass@<>``), to be
compared with the catalog's (``normalize``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from . import ROOT

PREFIXES = ("rollout/", "train/", "perf/", "eval/", "passrate/", "multi_turn/")
# module glob -> the prefix its bare metric names get (first match wins)
BARE_MODULES: tuple[tuple[str, str], ...] = (
    ("miles_core/algorithms/advantages/*.py", "rollout/"),
    ("miles_core/algorithms/opd.py", "rollout/"),
    ("miles_core/algorithms/*.py", "train/"),
    ("miles_core/training/critic.py", "train/"),
)
SCAN = ("miles_core", "flows", "tasks")
SKIP = ("miles_core/tracking/catalog.py",)
NOT_METRIC_SUFFIXES = (".json", ".pt", ".yaml", ".md", ".py")
PASS_THROUGH = ("train/<>", "rollout/<>")  # the trainer prefixing the algorithms' bare names
STRING_TESTS = ("startswith", "endswith", "removeprefix", "removesuffix")  # a key prefix tested, not a key
METRIC_DICT = re.compile(r"metric|totals")  # `metrics["x"] = ...` stores count; `group["lr"] = ...` does not
_IDENT = re.compile(r"[a-z][a-z0-9_\-]*\Z")  # critic-value_loss: the reference's names


@dataclass(frozen=True)
class Emitted:
    template: str  # normalized: every run-time part is "<>"
    path: str  # repository path of the emitting module
    line: int


def normalize(template: str) -> str:
    """``eval/<ds>-pass@<k>`` -> ``eval/<>-pass@<>``."""
    return re.sub(r"<[^<>]*>", "<>", template)


def _template(node: ast.AST, local: dict[str, ast.AST], depth: int = 0) -> str | None:
    """A Constant / JoinedStr / Name bound to one -> its text with '<>' for run-time parts."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and node.id in local and depth < 3:
        return _template(local[node.id], local, depth + 1)
    if isinstance(node, ast.JoinedStr):
        out = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                out.append(str(v.value))
            else:
                sub = _template(v.value, local, depth + 1) if isinstance(v, ast.FormattedValue) else None
                out.append(sub if sub is not None else "<>")
        return "".join(out)
    return None


def _docstring_nodes(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _single_assignments(func: ast.AST) -> dict[str, ast.AST]:
    """Names assigned exactly once in a function (or module) to a str constant or f-string."""
    seen: dict[str, list[ast.AST]] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            seen.setdefault(node.targets[0].id, []).append(node.value)
    return {k: v[0] for k, v in seen.items() if len(v) == 1 and isinstance(v[0], (ast.Constant, ast.JoinedStr))}


def _prefixed(rel: str, tree: ast.Module) -> list[Emitted]:
    skip = _docstring_nodes(tree) | {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                                     and n.func.attr in STRING_TESTS for a in n.args}
    out: list[Emitted] = []
    scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    seen: set[int] = set()
    for scope in reversed(scopes):  # innermost functions first, so their locals resolve
        local = _single_assignments(scope)
        for node in ast.walk(scope):
            if id(node) in seen or id(node) in skip or not isinstance(node, (ast.Constant, ast.JoinedStr)):
                continue
            seen.add(id(node))
            if isinstance(node, ast.JoinedStr):
                seen |= {id(n) for n in ast.walk(node)}
            text = _template(node, local)
            if text is None or not text.startswith(PREFIXES) or text.endswith(NOT_METRIC_SUFFIXES):
                continue
            if " " in text or "\n" in text:  # a message that happens to start with a prefix
                continue
            if text in PASS_THROUGH:  # re-prefixes names already collected as bare names
                continue
            out.append(Emitted(normalize(text), rel, node.lineno))
    return out


def _bare(rel: str, tree: ast.Module, prefix: str) -> list[Emitted]:
    tables = {id(n.value) for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign)) and isinstance(n.value, ast.Dict)
              and all(isinstance(t, ast.Name) and t.id.isupper() for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))}
    tables |= {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Dict)}
    out = []

    def add(name: object, line: int) -> None:
        if isinstance(name, str) and _IDENT.match(name):
            out.append(Emitted(prefix + name, rel, line))

    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and id(node) not in tables:
            for k in node.keys:
                if isinstance(k, ast.Constant):
                    add(k.value, k.lineno)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.value, ast.Name) and METRIC_DICT.search(node.value.id):
            add(node.slice.value, node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            for kw in node.keywords:
                if kw.arg:
                    add(kw.arg, kw.value.lineno)
    return out


def bare_prefix(rel: str) -> str | None:
    for pattern, prefix in BARE_MODULES:
        if Path(rel).match(pattern):
            return prefix
    return None


def scan(root: Path = ROOT, dirs: tuple[str, ...] = SCAN) -> list[Emitted]:
    """Every metric name template the code under ``dirs`` can emit, with where."""
    out: list[Emitted] = []
    for d in dirs:
        for path in sorted((root / d).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if "__pycache__" in path.parts or rel in SKIP:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            out += _prefixed(rel, tree)
            prefix = bare_prefix(rel)
            if prefix:
                out += _bare(rel, tree, prefix)
    return out


def emitted_templates(root: Path = ROOT) -> dict[str, list[Emitted]]:
    """Normalized template -> where it is emitted."""
    out: dict[str, list[Emitted]] = {}
    for e in scan(root):
        out.setdefault(e.template, []).append(e)
    return out

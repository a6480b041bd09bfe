"""Facts about the code that the docs may name: config fields, CLI commands and flags, argparse flags of
``python -m`` entry points, env vars, identifiers, modules and repository paths.

Everything here is read from the code (pydantic models, the typer app, ASTs), never written by hand.
"""

from __future__ import annotations

import ast
import json
import re
import types
import typing
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from . import ROOT

CODE_PACKAGES = ("miles_core", "flows", "tasks")  # the shipped code
SCAN_DIRS = CODE_PACKAGES + ("bench", "tools", "tests", "docker")  # where identifiers may come from


# ---- config ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConfigField:
    name: str
    group: str
    flag: str
    type: str  # rendered for people
    default: Any  # the Python default (None for a required field, which has required=True)
    required: bool
    description: str
    choices: tuple[str, ...] | None
    is_bool: bool

    @property
    def default_text(self) -> str:
        return "required" if self.required else json.dumps(self.default)


def _strip_optional(ann: Any) -> tuple[Any, bool]:
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        if len(args) < len(typing.get_args(ann)):
            return (args[0] if len(args) == 1 else typing.Union[tuple(args)]), True
    return ann, False


def render_type(ann: Any) -> str:
    inner, optional = _strip_optional(ann)
    if typing.get_origin(inner) is typing.Literal:
        text = "one of " + ", ".join(str(a) for a in typing.get_args(inner))
    elif isinstance(inner, type):
        text = inner.__name__
    else:
        text = str(inner).replace("typing.", "")
    return f"{text} (or None)" if optional else text


def _choices(ann: Any) -> tuple[str, ...] | None:
    inner, _ = _strip_optional(ann)
    return tuple(str(a) for a in typing.get_args(inner)) if typing.get_origin(inner) is typing.Literal else None


@lru_cache(maxsize=1)
def config_fields() -> dict[str, ConfigField]:
    """Every config field by its flat name, in GROUPS order."""
    from miles_core.config import GROUPS

    out = {}
    for group, model in GROUPS.items():
        for name, f in model.model_fields.items():
            required = f.is_required()
            default = None if required else f.get_default(call_default_factory=True)
            inner, _ = _strip_optional(f.annotation)
            out[name] = ConfigField(
                name=name, group=group, flag="--" + name.replace("_", "-"), type=render_type(f.annotation),
                default=default, required=required, description=f.description or "", choices=_choices(f.annotation),
                is_bool=inner is bool,
            )
    return out


def invalid_field_value(name: str, text: str) -> str | None:
    """Why ``text`` (as written after the field's flag) is not a valid value of config field ``name``: its
    Literal choices, its type, its range. None when it is valid. Parsed as the CLI parses a flag value."""
    import typing

    import yaml
    from pydantic import TypeAdapter, ValidationError

    from miles_core.config import GROUPS

    field = next(m.model_fields[name] for m in GROUPS.values() if name in m.model_fields)
    value: Any = yaml.safe_load(text) if text.strip() else text
    is_list = any(typing.get_origin(a) is list for a in (field.annotation, *typing.get_args(field.annotation)))
    if is_list and not isinstance(value, list):
        value = text.split()
    if field.annotation is str or _strip_optional(field.annotation)[0] is str:
        value = text  # the CLI keeps a str field's text as is
    try:
        kind = typing.Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation
        TypeAdapter(kind).validate_python(value)
    except ValidationError as e:
        return "; ".join(err["msg"] for err in e.errors())
    return None


# ---- CLI ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CliParam:
    name: str
    kind: str  # "option" | "argument"
    opts: tuple[str, ...]  # flags, e.g. ("--use-tis",); the metavar for an argument
    secondary: tuple[str, ...]  # e.g. ("--no-use-tis",)
    help: str
    default: Any
    required: bool
    type: str
    panel: str | None


@dataclass(frozen=True)
class CliCommand:
    name: str
    help: str
    params: tuple[CliParam, ...]

    @property
    def flags(self) -> set[str]:
        return {o for p in self.params if p.kind == "option" for o in p.opts + p.secondary} | {"--help"}


def _click():
    """typer's vendored click (typer >= 0.17), else click."""
    try:
        from typer._click import core
    except ImportError:  # pragma: no cover - older typer
        import click as core
    return core


def _param_type(p: Any) -> str:
    if getattr(p, "is_flag", False):
        return "flag"
    td = getattr(p, "type_descriptor", None)
    ann = getattr(td, "annotation", None) if td is not None else None
    if ann is None and getattr(p, "type", None) is not None:
        return p.type.name
    inner, _ = _strip_optional(ann)
    return {"str": "text", "int": "integer", "float": "number", "bool": "flag"}.get(getattr(inner, "__name__", ""), str(inner))


@lru_cache(maxsize=1)
def cli_commands() -> dict[str, CliCommand]:
    """The `miles` commands of the typer app (flows/cli.py), with every parameter."""
    import typer.main

    from flows.cli import app

    core = _click()
    group = typer.main.get_command(app)
    ctx = core.Context(group, info_name="miles")
    out = {}
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        params = []
        for p in cmd.params:
            if p.name == "help":
                continue
            kind = "argument" if type(p).__name__.endswith("Argument") else "option"
            opts = tuple(p.opts) if kind == "option" else ((p.metavar or p.name.upper()),)
            params.append(CliParam(
                name=p.name, kind=kind, opts=opts, secondary=tuple(getattr(p, "secondary_opts", ()) or ()),
                help=(getattr(p, "help", None) or "").strip(), default=p.default, required=bool(p.required),
                type=_param_type(p), panel=getattr(p, "rich_help_panel", None),
            ))
        out[name] = CliCommand(name, (cmd.help or "").strip(), tuple(params))
    return out


def cli_root_flags() -> set[str]:
    """Options of `miles` itself, before the command (`miles --debug train ...`)."""
    import typer.main

    from flows.cli import app

    return {o for p in typer.main.get_command(app).params if p.name != "help" for o in (*p.opts, *getattr(p, "secondary_opts", ()))}


def cli_root_help() -> str:
    from flows.cli import app

    return app.info.help or ""


# ---- python modules and argparse entry points -----------------------------------------------------
def module_file(dotted: str) -> Path | None:
    """The file of a module of this repository (a.b -> a/b.py or a/b/__init__.py), or None."""
    base = ROOT.joinpath(*dotted.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


@lru_cache(maxsize=None)
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@lru_cache(maxsize=None)
def argparse_flags(dotted: str) -> frozenset[str] | None:
    """Flags of `python -m <dotted>` (the module, or its __main__), from its add_argument calls."""
    path = module_file(dotted)
    if path is None:
        return None
    if path.name == "__init__.py" and (path.parent / "__main__.py").is_file():
        path = path.parent / "__main__.py"
    flags = {"--help", "-h"}
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")}
    return frozenset(flags)


def _top_level_names(tree: ast.Module | ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):
            sub = ast.Module(body=node.body + getattr(node, "orelse", []) + [s for h in getattr(node, "handlers", []) for s in h.body],
                             type_ignores=[])
            names |= _top_level_names(sub)
    if isinstance(tree, ast.Module) and "__getattr__" in names:  # lazy exports: the names its tables list
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return names


def resolve_module_path(dotted: str) -> str | None:
    """None if `a.b.c[.Symbol[.attr]]` names a module of this repository and symbols defined in it; else why not."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        path = module_file(".".join(parts[:i]))
        if path is None:
            continue
        rest = parts[i:]
        if not rest:
            return None
        tree = _parse(path)
        if rest[0] not in _top_level_names(tree):
            return f"module {'.'.join(parts[:i])} ({path.relative_to(ROOT)}) defines no {rest[0]!r}"
        cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == rest[0]), None)
        if len(rest) > 1 and cls is not None and rest[1] not in _top_level_names(cls) and not _is_field(cls, rest[1]):
            return f"class {'.'.join(parts[:i + 1])} has no attribute {rest[1]!r}"
        return None
    return f"no module {parts[0]!r}" if len(parts) == 1 else f"no module named by {dotted!r} in this repository"


def _is_field(cls: ast.ClassDef, name: str) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == name for n in ast.walk(cls))


def symbol_in_file(path: Path, symbol: str) -> bool:
    parts = symbol.split(".")
    tree = _parse(path)
    if parts[0] not in _top_level_names(tree):
        return False
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == parts[0]), None)
    return len(parts) == 1 or cls is None or parts[1] in _top_level_names(cls) or _is_field(cls, parts[1])


# ---- identifiers ----------------------------------------------------------------------------------
def py_files(dirs: tuple[str, ...] = SCAN_DIRS) -> list[Path]:
    out = []
    for d in dirs:
        out += sorted(p for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)
    return out


@lru_cache(maxsize=1)
def identifiers() -> frozenset[str]:
    """Every name the code defines or uses (functions, classes, args, attributes, keywords, words of short strings),
    plus config fields and recipe keys. From tests/, only the functions and classes they define."""
    names: set[str] = set(config_fields())
    for path in py_files():
        rel = path.relative_to(ROOT).parts
        if rel[0] == "tests":  # tests: only what they define (fixtures, helpers); never their strings
            if rel[:2] != ("tests", "docs"):  # the docs tests plant absent names on purpose
                names |= {n.name for n in ast.walk(_parse(path)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
            continue
        for node in ast.walk(_parse(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names |= set((node.asname or node.name).split("."))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 80:
                names |= set(_WORD.findall(node.value))
    import yaml

    for path in (ROOT / "deployments").rglob("*.yaml"):
        data = yaml.safe_load(path.read_text())
        if isinstance(data, dict):
            names |= {str(k) for k in data}
    return frozenset(names)


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# ---- config fields the code does not read yet ------------------------------------------------------
@lru_cache(maxsize=1)
def unused_config_fields() -> frozenset[str]:
    """Fields no code reads: accepted, not used yet. A read is ``<x>.<group>.<field>``, ``<v>.<field>`` where ``v``
    holds a group (``r = cfg.rollout``, ``algo: AlgoConfig``, ``self.algo = cfg.algo``), the field's name as a string
    (getattr loops, flat dicts) outside miles_core/config, or an attribute read in a property of miles_core/config
    (``weight_sync_mode`` reads ``update_weight_mode``). Validators and rules only check a value: they are not reads.
    Attributes of other objects with a field's name (a tensor's ``.device``) are not reads either."""
    fields = config_fields()
    by_group: dict[str, set[str]] = {}
    for f in fields.values():
        by_group.setdefault(f.group, set()).add(f.name)
    used: set[str] = set()
    config_dir = ROOT / "miles_core" / "config"
    for path in py_files(CODE_PACKAGES):
        tree = _parse(path)
        if path.is_relative_to(config_dir):
            used |= _property_reads(tree)
            continue
        used |= field_reads(tree, by_group)
    return frozenset(n for n in fields if n not in used)


def field_reads(tree: ast.Module, by_group: dict[str, set[str]]) -> set[str]:
    """Names read from a config group in ``tree`` (code outside miles_core/config), and string constants."""
    holders = _group_holders(tree, by_group)
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = _owner_name(node.value)
            if owner in holders and node.attr in by_group[holders[owner]]:
                used.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and not _is_docstring_text(node.value):
            used.add(node.value)
    return used


_GROUP_CLASSES = {"ClusterConfig": "cluster", "RolloutConfig": "rollout", "DataConfig": "data", "AlgoConfig": "algo",
                  "CheckpointConfig": "checkpoint", "EvalConfig": "eval", "TrackingConfig": "tracking", "MiscConfig": "misc",
                  "ParallelConfig": "parallel", "SglangConfig": "sglang"}


def _owner_name(node: ast.AST) -> str | None:
    """``a.b.c`` -> ``c``'s owner name ``b`` (the last name of the owner expression)."""
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def _group_holders(tree: ast.Module, by_group: dict[str, set[str]]) -> dict[str, str]:
    """Names (variables, attributes) that hold a config group in this module -> the group."""
    holders = {g: g for g in by_group}  # cfg.rollout.x, self.algo.x, algo.x
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) and node.value.attr in by_group:
            for t in node.targets:
                targets = t.elts if isinstance(t, ast.Tuple) else [t]
                for name in filter(None, map(_owner_name, targets)):
                    holders[name] = node.value.attr
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):  # r, a = c.rollout, c.algo
            for t in node.targets:
                if isinstance(t, ast.Tuple):
                    for tgt, val in zip(t.elts, node.value.elts):
                        if isinstance(val, ast.Attribute) and val.attr in by_group and _owner_name(tgt):
                            holders[_owner_name(tgt)] = val.attr
        elif isinstance(node, ast.arg) and isinstance(node.annotation, (ast.Name, ast.Constant)):
            ann = node.annotation.id if isinstance(node.annotation, ast.Name) else str(node.annotation.value)
            if ann in _GROUP_CLASSES:
                holders[node.arg] = _GROUP_CLASSES[ann]
    return holders


def _property_reads(tree: ast.Module) -> set[str]:
    """Attributes read inside the ``@property`` methods of a config module (``self.checkpoint.load``)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list):
            out |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
    return out


def _is_docstring_text(s: str) -> bool:
    return "\n" in s or " " in s


# ---- env vars -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str | None  # the expression miles sets by default (env.py), if any
    read_in: tuple[str, ...]  # repository files that read it


_ENV_CALLS = {("environ", "get"), ("os", "getenv")}


def _env_reads(tree: ast.Module) -> set[str]:
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
              and isinstance(n.value.value, str) for t in n.targets if isinstance(t, ast.Name)}

    def value(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return consts.get(node.id) if isinstance(node, ast.Name) else None

    def is_environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ" or isinstance(node, ast.Name) and node.id == "environ"

    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            owner = node.func.value
            if (node.func.attr in ("get", "setdefault", "pop") and is_environ(owner)) or \
                    (node.func.attr == "getenv" and isinstance(owner, ast.Name) and owner.id == "os"):
                out.add(value(node.args[0]))
        elif isinstance(node, ast.Subscript) and is_environ(node.value):
            out.add(value(node.slice))
        elif isinstance(node, ast.Compare) and len(node.comparators) == 1 and is_environ(node.comparators[0]):
            out.add(value(node.left))
    return {v for v in out if v}


ENV_TABLES = (ROOT / "miles_core" / "env.py", ROOT / "flows" / "env.py")  # each a dict assigned to `defaults`


@lru_cache(maxsize=1)
def env_vars() -> dict[str, EnvVar]:
    """Env vars miles sets by default (flows/env.py's configure_environment: the library's table in miles_core/env.py,
    then Prefect's in flows/env.py) or reads anywhere in its code."""
    defaults: dict[str, str] = {}
    for node in (n for env_py in ENV_TABLES for n in ast.walk(_parse(env_py))):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and \
                any(isinstance(t, ast.Name) and t.id == "defaults" for t in node.targets):
            for k, v in zip(node.value.keys, node.value.values):
                if isinstance(k, ast.Constant):
                    defaults[k.value] = ast.unparse(v)
    reads: dict[str, list[str]] = {}
    for path in py_files(CODE_PACKAGES):
        for name in _env_reads(_parse(path)):
            reads.setdefault(name, []).append(str(path.relative_to(ROOT)))
    names = list(defaults) + sorted(n for n in reads if n not in defaults)
    return {n: EnvVar(n, defaults.get(n), tuple(reads.get(n, ()))) for n in names}


def docker_build_args() -> set[str]:
    """The build arguments our Dockerfiles declare (``ARG NAME``): set with ``docker build --build-arg NAME=value``."""
    return {m for path in sorted((ROOT / "docker").glob("Dockerfile*"))
            for m in re.findall(r"^ARG\s+([A-Z][A-Z0-9_]*)", path.read_text(encoding="utf-8"), re.M)}


# ---- Prefect flows and tasks --------------------------------------------------------------------
@dataclass(frozen=True)
class PrefectUnit:
    kind: str  # "flow" | "task"
    name: str  # the Prefect name
    function: str  # module.function
    options: dict[str, str]  # decorator keywords other than name, as source text
    doc: str  # first line of the docstring


def prefect_units() -> list[PrefectUnit]:
    """Every @flow in flows/ and @task in tasks/, read from the decorators (no Prefect import)."""
    out = []
    for path in py_files(("flows", "tasks")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in _parse(path).body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for dec in node.decorator_list:
                call = dec if isinstance(dec, ast.Call) else None
                fn = call.func if call else dec
                kind = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else None
                if kind not in ("flow", "task"):
                    continue
                kw = {k.arg: ast.unparse(k.value) for k in (call.keywords if call else []) if k.arg}
                name = ast.literal_eval(kw.pop("name")) if "name" in kw else node.name
                doc = (ast.get_docstring(node) or "").strip().splitlines()
                out.append(PrefectUnit(kind, name, f"{module}.{node.name}", kw, doc[0] if doc else ""))
    return out


@lru_cache(maxsize=1)
def deployment_names() -> frozenset[str]:
    """``<flow name>/<deployment name>`` of every deployment of deployments/prefect.yaml (what `prefect deployment run` takes)."""
    import yaml

    flows = {u.function: u.name for u in prefect_units() if u.kind == "flow"}
    text = (ROOT / "deployments" / "prefect.yaml").read_text(encoding="utf-8")
    data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # 3,000 lines: the C loader when built
    out = set()
    for d in data.get("deployments") or []:
        path, _, function = d["entrypoint"].partition(":")
        module = ".".join(Path(path).with_suffix("").parts)
        out.add(f"{flows.get(f'{module}.{function}', function)}/{d['name']}")
    return frozenset(out)


# ---- recipes --------------------------------------------------------------------------------------
def recipes() -> list[str]:
    from flows.recipes import list_recipes

    return list_recipes()

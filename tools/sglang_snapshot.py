"""The pinned SGLang's server arguments and HTTP protocol, read from the wheel's source with ``ast`` (sglang is
never imported).

    python -m tools.sglang_snapshot                 # download the wheel if needed, write both snapshots
    python -m tools.sglang_snapshot --wheel W.whl   # from a given wheel
    python -m tools.sglang_snapshot --check         # exit 1 if a committed snapshot differs

Two files: ``miles_core/config/server_args.json`` (the CLI, below) and
``miles_core/rollout/sglang/protocol.json`` (routes, request fields, the weight-update session rule and
``init_custom_process_group``: tools/sglang_protocol.py). Regenerating from a newer wheel shows the
diff of both in git.

``make sglang-snapshot`` runs the first form. The wheel is fetched with
``pip download --no-deps sglang==<SGLANG_VERSION>`` into ``.cache/sglang-wheel``.

How SGLang 0.5.23 declares its CLI: ``sglang/srt/server_args.py`` lists the input namespaces
(``_INPUT_NAMESPACES``), classes in ``sglang/srt/arg_groups/fields/*.py`` whose fields read
``name: A[T, "help"] = default`` or ``name: A[T, Arg(help=..., choices=..., aliases=..., ...)]``;
``arg_groups/arg_utils.py::add_cli_args_from_dataclass`` turns each into an argparse argument
(bool -> store_true, List[X] -> nargs "+", Literal -> choices, ``cli_name`` / ``aliases`` -> flags,
``no_cli`` -> none); ``ServerArgs.add_cli_args`` registers a few more by hand (dynamic choices,
deprecated spellings). This module mirrors those rules; a change of them in a new SGLang shows up
as a diff of the snapshot (and ``--check`` fails).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "miles_core" / "config" / "server_args.json"
PROTOCOL_OUT = ROOT / "miles_core" / "rollout" / "sglang" / "protocol.json"
WHEEL_DIR = ROOT / ".cache" / "sglang-wheel"
SERVER_ARGS = "sglang/srt/server_args.py"
FIELDS_PKG = "sglang.srt.arg_groups.fields."
CHOICES = "sglang/srt/arg_groups/choices.py"
# argparse type= callables of SGLang -> the value type the snapshot records
TYPE_PARSERS = {"json.loads": "json", "json_list_type": "json_list", "human_readable_int": "int", "nullable_str": "str"}


def sglang_version() -> str:
    from miles_core.rollout.sglang import SGLANG_VERSION

    return SGLANG_VERSION


def find_wheel(version: str) -> Path:
    """The wheel in .cache/sglang-wheel, downloaded (pip download --no-deps) when missing."""
    found = sorted(WHEEL_DIR.glob(f"sglang-{version}-*.whl"))
    if not found:
        WHEEL_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"sglang=={version}",
                        "-d", str(WHEEL_DIR)], check=True)
        found = sorted(WHEEL_DIR.glob(f"sglang-{version}-*.whl"))
    if not found:
        raise SystemExit(f"no sglang-{version} wheel in {WHEEL_DIR} after pip download")
    return found[0]


# ---- reading the source ---------------------------------------------------------------------------
class Source:
    """The .py files of a wheel, parsed on demand."""

    def __init__(self, wheel: Path):
        self.zip = zipfile.ZipFile(wheel)
        self._trees: dict[str, ast.Module] = {}

    def tree(self, path: str) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse(self.zip.read(path).decode(), filename=path)
        return self._trees[path]

    def constant(self, path: str, name: str) -> Any:
        """A module-level ``NAME = <literal>`` of ``path`` (list, set(...) of a literal, ...); None if not literal."""
        for node in self.tree(path).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return _literal(node.value, self, path)
        return None


def _imports(tree: ast.Module) -> dict[str, str]:
    """Imported name -> its module (``from m import a`` -> {"a": "m"})."""
    return {a.asname or a.name: n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module for a in n.names}


def _literal(node: ast.AST, src: Source | None = None, path: str | None = None) -> Any:
    """A literal value, with the few non-literal forms SGLang's defaults use: arithmetic of numbers,
    ``msgspec.field(default_factory=list|dict)``, ``set(NAME)``, ``NAME`` of a constant, ``a + b`` of lists.
    Raises ValueError for anything else."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.BinOp):
        left, right = _literal(node.left, src, path), _literal(node.right, src, path)
        ops = {ast.Mult: lambda a, b: a * b, ast.Add: lambda a, b: a + b, ast.Pow: lambda a, b: a**b,
               ast.Sub: lambda a, b: a - b, ast.LShift: lambda a, b: a << b}
        if type(node.op) in ops:
            return ops[type(node.op)](left, right)
    if isinstance(node, ast.Call):
        func = ast.unparse(node.func)
        factory = {kw.arg: ast.unparse(kw.value) for kw in node.keywords}.get("default_factory")
        if func in ("msgspec.field", "field", "dataclasses.field") and factory in ("list", "dict"):
            return [] if factory == "list" else {}
        if func in ("set", "frozenset", "list", "sorted") and len(node.args) == 1:
            return sorted(_literal(node.args[0], src, path))
    if isinstance(node, ast.Name) and src is not None and path is not None:
        module = _imports(src.tree(path)).get(node.id)
        value = src.constant(module.replace(".", "/") + ".py", node.id) if module else src.constant(path, node.id)
        if value is not None:
            return value
    raise ValueError(ast.unparse(node))


# ---- one field ------------------------------------------------------------------------------------
def _split_optional(tp: ast.expr) -> tuple[ast.expr, bool]:
    """Optional[X] / X | None / Union[X, None] -> (X, True)."""
    if isinstance(tp, ast.Subscript) and ast.unparse(tp.value) in ("Optional", "typing.Optional"):
        return tp.slice, True
    if isinstance(tp, ast.BinOp) and isinstance(tp.op, ast.BitOr) and ast.unparse(tp.right) == "None":
        return tp.left, True
    if isinstance(tp, ast.Subscript) and ast.unparse(tp.value) == "Union" and isinstance(tp.slice, ast.Tuple):
        rest = [e for e in tp.slice.elts if ast.unparse(e) != "None"]
        if len(rest) == 1 and len(rest) < len(tp.slice.elts):
            return rest[0], True
    return tp, False


def _base_type(tp: ast.expr) -> str:
    name = ast.unparse(tp)
    return name if name in ("bool", "int", "float", "str") else "str"


def _list_of(tp: ast.expr) -> str | None:
    """List[X] / list[X] -> X's type name; None if not a list."""
    if isinstance(tp, ast.Subscript) and ast.unparse(tp.value) in ("List", "list", "typing.List"):
        return _base_type(tp.slice)
    return None


def _metadata(annotation: ast.expr) -> tuple[ast.expr, dict[str, ast.expr]] | None:
    """``A[T, "help"]`` / ``A[T, Arg(...)]`` -> (T, Arg's keywords as AST); None for a field without CLI metadata."""
    if not (isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) in ("A", "Annotated")):
        return None
    elts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
    for meta in elts[1:]:
        if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
            return elts[0], {"help": meta}
        if isinstance(meta, ast.JoinedStr):
            return elts[0], {"help": meta}
        if isinstance(meta, ast.Call) and ast.unparse(meta.func) == "Arg":
            return elts[0], {kw.arg: kw.value for kw in meta.keywords}
    return None


def _help(node: ast.expr | None) -> str:
    if node is None:
        return ""
    try:
        text = str(ast.literal_eval(node))
    except ValueError:
        text = ast.unparse(node)
    text = " ".join(text.split())
    first = text.split(". ")[0].rstrip(".")
    return first[:200] + ("..." if len(first) > 200 else "")


def _default(node: ast.expr | None, src: Source, path: str) -> dict[str, Any]:
    if node is None:
        return {"default": None, "required": True}
    try:
        return {"default": _literal(node, src, path)}
    except ValueError as e:
        return {"default": None, "default_expr": str(e)}


def _choices(node: ast.expr | None, literal: list | None, src: Source, path: str) -> dict[str, Any]:
    """Closed choices (a literal list or Literal[...]) are validated by miles; named lists (which SGLang
    plugins may extend) are recorded as ``choices_open``."""
    if node is None:
        return {"choices": literal} if literal else {}
    try:
        values = _literal(node, src, path)
    except ValueError:
        return {"choices_expr": ast.unparse(node)}
    return {"choices": values, **({"choices_open": True} if not isinstance(node, (ast.List, ast.Tuple)) else {})}


def field_entry(name: str, annotation: ast.expr, value: ast.expr | None, namespace: str,
                src: Source, path: str) -> dict[str, Any] | None:
    """One CLI argument as add_cli_args_from_dataclass registers it; None when it has no CLI form."""
    meta = _metadata(annotation)
    if meta is None:
        return None
    tp, arg = meta
    if ast.unparse(arg.get("no_cli", ast.Constant(False))) == "True":
        return None
    flags = [_literal(arg["cli_name"]) if "cli_name" in arg else "--" + name.replace("_", "-")]
    flags += list(_literal(arg["aliases"])) if "aliases" in arg else []
    inner, nullable = _split_optional(tp)
    parser = ast.unparse(arg["type_parser"]) if "type_parser" in arg else None
    nargs = _literal(arg["nargs"]) if "nargs" in arg else None
    literal = None
    if isinstance(inner, ast.Subscript) and ast.unparse(inner.value) in ("Literal", "typing.Literal"):
        elts = inner.slice.elts if isinstance(inner.slice, ast.Tuple) else [inner.slice]
        literal = [ast.literal_eval(e) for e in elts]
    entry: dict[str, Any] = {"name": name, "flags": flags, "namespace": namespace}
    action = ast.unparse(arg["action"]) if "action" in arg else None
    if action == "argparse.BooleanOptionalAction":
        entry.update(kind="boolean_optional", type="bool")
    elif action is not None:  # LoRAPathAction: values as given (action_kwargs nargs "*")
        extra = arg.get("action_kwargs")
        kwargs = {ast.unparse(k).strip("'\""): v for k, v in zip(extra.keys, extra.values)} if isinstance(extra, ast.Dict) else {}
        entry.update(kind="list", type="list[str]", nargs=_literal(kwargs["nargs"]) if "nargs" in kwargs else "+")
    elif literal is not None:
        typed = [v for v in literal if v is not None]
        entry.update(kind="value", type=type(typed[0]).__name__ if typed else "str")
    elif _list_of(inner) is not None and parser is None:
        entry.update(kind="list", type=f"list[{_list_of(inner)}]", nargs=nargs or "+")
    elif ast.unparse(inner) == "bool" and parser is None:
        entry.update(kind="store_true", type="bool")
    else:
        vtype = TYPE_PARSERS.get(parser, "str") if parser else _base_type(inner)
        kind = {"?": "optional_value", "+": "list", "*": "list"}.get(nargs, "value")
        entry.update(kind=kind, type=f"list[{vtype}]" if kind == "list" else vtype, **({"nargs": nargs} if nargs else {}))
    if "const" in arg:
        entry["const"] = _literal(arg["const"])
    entry["nullable"] = nullable
    entry.update(_default(value, src, path))
    entry.update(_choices(arg.get("choices"), literal, src, path))
    entry["help"] = _help(arg.get("help"))
    return entry


# ---- the whole CLI --------------------------------------------------------------------------------
def namespaces(src: Source) -> list[tuple[str, str]]:
    """(class name, module path) of every input namespace, in ServerArgs' order."""
    tree = src.tree(SERVER_ARGS)
    imports = _imports(tree)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in node.targets):
            names = [e.id for e in node.value.elts]
            return [(n, imports[n].replace(".", "/") + ".py") for n in names]
    raise SystemExit(f"{SERVER_ARGS}: no _INPUT_NAMESPACES list; the ServerArgs layout changed, update tools/sglang_snapshot.py")


def namespace_fields(src: Source, cls_name: str, path: str) -> tuple[list[dict], dict[str, dict]]:
    """(CLI entries, every field's default/help by name: the manual registrations read them)."""
    cls = next(n for n in src.tree(path).body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    ns = next((ast.literal_eval(s.value) for s in cls.body if isinstance(s, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == "_NS_PATH" for t in s.targets)), cls_name.lower())
    entries, declared = [], {}
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)) or stmt.target.id.startswith("_"):
            continue
        name = stmt.target.id
        declared[name] = {"namespace": ns, **_default(stmt.value, src, path),
                          "nullable": _split_optional((_metadata(stmt.annotation) or (stmt.annotation,))[0])[1]}
        entry = field_entry(name, stmt.annotation, stmt.value, ns, src, path)
        if entry is not None:
            entries.append(entry)
    return entries, declared


def manual_entries(src: Source, declared: dict[str, dict]) -> list[dict]:
    """The arguments ``ServerArgs.add_cli_args`` registers by hand (parser.add_argument calls)."""
    cls = next(n for n in src.tree(SERVER_ARGS).body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args")
    out = []
    for call in ast.walk(fn):
        if not (isinstance(call, ast.Call) and ast.unparse(call.func) == "parser.add_argument"):
            continue
        flags = [a.value for a in call.args if isinstance(a, ast.Constant)]
        kw = {k.arg: k.value for k in call.keywords}
        name = _literal(kw["dest"]) if "dest" in kw else flags[0].lstrip("-").replace("-", "_")
        action = None if "action" not in kw else kw["action"].value if isinstance(kw["action"], ast.Constant) else ast.unparse(kw["action"])
        base = declared.get(name, {"namespace": "cli", "nullable": True, "default": None})
        entry: dict[str, Any] = {"name": name, "flags": flags, "namespace": base["namespace"]}
        if action in ("store_true", "DeprecatedStoreTrueAction"):
            entry.update(kind="store_true", type="bool")
        else:
            entry.update(kind="value", type=_base_type(kw["type"]) if "type" in kw else "str")
        entry["nullable"] = base["nullable"]
        default = kw.get("default")
        if default is not None and ast.unparse(default).startswith("_declared_default("):
            entry.update({k: base[k] for k in ("default", "default_expr") if k in base})
        else:
            entry.update(_default(default, src, SERVER_ARGS) if default is not None else {"default": False if entry["type"] == "bool" else None})
        entry.update(_choices(kw.get("choices"), None, src, SERVER_ARGS))
        if "choices" in entry and not isinstance(kw["choices"], (ast.List, ast.Tuple)):
            entry["choices_open"] = True
        if action and action.startswith("Deprecated") or "new_flag" in kw:
            entry["deprecated"] = _literal(kw["new_flag"]) if "new_flag" in kw else True
        entry["help"] = _help(kw.get("help"))
        out.append(entry)
    return out


def snapshot(wheel: Path, version: str) -> dict[str, Any]:
    src = Source(wheel)
    entries: dict[str, dict] = {}
    declared: dict[str, dict] = {}
    for cls_name, path in namespaces(src):
        fields, seen = namespace_fields(src, cls_name, path)
        declared.update(seen)
        entries.update({e["name"]: e for e in fields})
    respelled = {}  # a deprecated second spelling of a field registered above: flag -> the field
    for e in manual_entries(src, declared):
        if e["name"] in entries:
            respelled.update({f: e["name"] for f in e["flags"]})
        else:
            entries[e["name"]] = e
    return {"sglang_version": version, "source": f"{wheel.name}: {SERVER_ARGS} + sglang/srt/arg_groups/fields/*.py",
            "generated_by": "python -m tools.sglang_snapshot", "deprecated_spellings": respelled,
            "fields": dict(sorted(entries.items()))}


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=False, default=sorted) + "\n"


def main(argv: list[str] | None = None) -> int:
    from tools.sglang_protocol import protocol

    p = argparse.ArgumentParser(prog="python -m tools.sglang_snapshot", description=__doc__.splitlines()[0])
    p.add_argument("--wheel", type=Path, help="an sglang wheel (default: .cache/sglang-wheel, downloaded when missing)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--protocol-out", type=Path, default=PROTOCOL_OUT)
    p.add_argument("--check", action="store_true", help="exit 1 if --out or --protocol-out differs from what the wheel gives")
    args = p.parse_args(argv)
    version = sglang_version()
    wheel = args.wheel or find_wheel(version)
    outputs = {args.out: render(snapshot(wheel, version)), args.protocol_out: render(protocol(Source(wheel), version, wheel.name))}
    if args.check:
        stale = [path for path, text in outputs.items() if not (path.exists() and path.read_text() == text)]
        for path in outputs:
            print(f"{path}: {'STALE: run make sglang-snapshot' if path in stale else 'up to date'}")
        return 1 if stale else 0
    for path, text in outputs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote {args.out} ({len(json.loads(outputs[args.out])['fields'])} arguments of sglang {version}) and "
          f"{args.protocol_out} ({len(json.loads(outputs[args.protocol_out])['routes'])} routes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

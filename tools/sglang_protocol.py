"""SGLang's HTTP protocol, read from the pinned wheel's source with ``ast`` (sglang is never imported).

Called by ``python -m tools.sglang_snapshot`` (``make sglang-snapshot``), which writes the result to
``miles_core/rollout/sglang/protocol.json`` next to the server-argument snapshot. Recorded:

- ``routes``: every route of ``sglang/srt/entrypoints/http_server.py`` with a literal path
  (``@app.get`` / ``@app.post`` / ``@app.api_route(methods=[...])``) -> its methods, and the request class
  its handler takes (``obj: X`` or ``obj: Annotated[X, Body()]``);
- ``requests``: the fields (name, annotation, default) of each such class in ``managers/io_struct.py``,
  bases included (``BaseReq``'s rid), plus ``SamplingParams`` (``sampling/sampling_params.py``);
- ``session``: the weight-update session rule of ``managers/scheduler_components/weight_updater.py``:
  the updates refused outside ``begin_weight_update() .. end_weight_update()`` and SGLang's messages;
- ``init_custom_process_group``: the source of SGLang's function (``utils/common.py``), so a test can run
  SGLang's own receiver side on CPU without importing sglang (its module needs pybase64 and more);
- ``dumper``: the tensor dumper of ``debug_utils/dumper.py`` (miles_core/rollout/dumper.py writes its layout): the fields
  and defaults of ``DumperConfig`` (the key=value pairs of dumper_inference / _fwd_only / _fwd_bwd, the DUMPER_*
  environment variables), its env prefix, the fields its non-intrusive hooks dump in mode "core" (the plugins'
  ``core_fields``), their name prefix and the methods of ``/dumper/{method}``.
"""

from __future__ import annotations

import ast
from typing import Any

HTTP_SERVER = "sglang/srt/entrypoints/http_server.py"
IO_STRUCT = "sglang/srt/managers/io_struct.py"
SAMPLING = "sglang/srt/sampling/sampling_params.py"
WEIGHT_UPDATER = "sglang/srt/managers/scheduler_components/weight_updater.py"
COMMON = "sglang/srt/utils/common.py"
DUMPER = "sglang/srt/debug_utils/dumper.py"
DECORATORS = {"get": ["GET"], "post": ["POST"], "put": ["PUT"], "delete": ["DELETE"]}


def _route(dec: ast.expr) -> tuple[str, list[str]] | None:
    """``@app.get("/x")`` -> ("/x", ["GET"]); ``@app.api_route("/x", methods=[...])`` -> ("/x", methods)."""
    if not (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and ast.unparse(dec.func.value) == "app"):
        return None
    if not (dec.args and isinstance(dec.args[0], ast.Constant) and isinstance(dec.args[0].value, str)):
        return None  # a path from the environment (ollama, vertex): not a fixed route
    kind, path = dec.func.attr, dec.args[0].value
    if kind == "api_route":
        methods = next((ast.literal_eval(k.value) for k in dec.keywords if k.arg == "methods"), ["GET"])
        return path, sorted(methods)
    return (path, DECORATORS[kind]) if kind in DECORATORS else None


def _request_class(fn: ast.AsyncFunctionDef | ast.FunctionDef) -> str | None:
    for arg in fn.args.args:
        if arg.arg != "obj" or arg.annotation is None:
            continue
        ann = arg.annotation
        if isinstance(ann, ast.Subscript) and ast.unparse(ann.value) == "Annotated":
            ann = ann.slice.elts[0] if isinstance(ann.slice, ast.Tuple) else ann.slice
        return ast.unparse(ann)
    return None


def routes(src) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for node in ast.walk(src.tree(HTTP_SERVER)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for dec in node.decorator_list:
            found = _route(dec)
            if found is None:
                continue
            path, methods = found
            entry = out.setdefault(path, {"methods": [], "request": _request_class(node)})
            entry["methods"] = sorted(set(entry["methods"]) | set(methods))
    return dict(sorted(out.items()))


def _fields(cls: ast.ClassDef) -> dict[str, dict[str, Any]]:
    fields = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            entry: dict[str, Any] = {"type": ast.unparse(stmt.annotation)}
            if stmt.value is None:
                entry["required"] = True
            else:
                entry["default"] = ast.unparse(stmt.value)
            fields[stmt.target.id] = entry
    return fields


def request_fields(src, names: set[str]) -> dict[str, dict[str, Any]]:
    """Fields of each named io_struct class, its io_struct bases' first (as msgspec / dataclasses order them)."""
    classes = {n.name: n for n in src.tree(IO_STRUCT).body if isinstance(n, ast.ClassDef)}

    def collect(name: str) -> dict[str, dict[str, Any]]:
        cls = classes[name]
        merged: dict[str, dict[str, Any]] = {}
        for base in cls.bases:
            if ast.unparse(base) in classes:
                merged.update(collect(ast.unparse(base)))
        merged.update(_fields(cls))
        return merged

    out = {n: collect(n) for n in sorted(names) if n in classes}
    sampling = next(n for n in src.tree(SAMPLING).body if isinstance(n, ast.ClassDef) and n.name == "SamplingParams")
    out["SamplingParams"] = _fields(sampling)
    return out


def _message(node: ast.expr) -> str:
    """The ``message=`` string of a ``return XOutput(success=False, message=...)``."""
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            for kw in call.keywords:
                if kw.arg == "message":
                    return ast.literal_eval(kw.value)
    raise ValueError(f"no message in {ast.unparse(node)}")


def session_rule(src) -> dict[str, Any]:
    """Which weight updates need an open session, and SGLang's answers (``if self._session is [not] None: return``)."""
    cls = next(n for n in ast.walk(src.tree(WEIGHT_UPDATER)) if isinstance(n, ast.ClassDef) and n.name == "SchedulerWeightUpdaterManager")
    needs, begin_open, end_none = {}, None, None
    for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
        for stmt in ast.walk(fn):
            if not (isinstance(stmt, ast.If) and ast.unparse(stmt.test) in ("self._session is None", "self._session is not None")):
                continue
            ret = next((s for s in stmt.body if isinstance(s, ast.Return)), None)
            if ret is None:
                continue
            if fn.name == "begin_weight_update":
                begin_open = _message(ret)
            elif fn.name == "end_weight_update":
                end_none = _message(ret)
            else:
                needs[fn.name] = _message(ret)
    if not needs or begin_open is None or end_none is None:
        raise SystemExit(f"{WEIGHT_UPDATER}: the session rule moved; update tools/sglang_protocol.py")
    return {"requires_session": dict(sorted(needs.items())), "begin_when_open": begin_open, "end_when_closed": end_none}


def function_source(src, path: str, name: str) -> str:
    tree = src.tree(path)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(src.zip.read(path).decode(), fn) + "\n"


def protocol(src, version: str, wheel_name: str) -> dict[str, Any]:
    table = routes(src)
    return {
        "sglang_version": version,
        "source": f"{wheel_name}: {HTTP_SERVER}, {IO_STRUCT}, {SAMPLING}, {WEIGHT_UPDATER}, {COMMON}",
        "generated_by": "python -m tools.sglang_snapshot",
        "routes": table,
        "requests": request_fields(src, {r["request"] for r in table.values() if r["request"]}),
        "session": session_rule(src),
        "init_custom_process_group": function_source(src, COMMON, "init_custom_process_group"),
        "dumper": dumper_facts(src),
    }


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _returned(fn: ast.FunctionDef) -> ast.expr:
    return next(n.value for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value is not None)


def dumper_facts(src) -> dict[str, Any]:
    """DumperConfig's fields (name -> type, default), its env prefix, the core fields and name prefix of the
    non-intrusive hooks and the control methods (``_DumperHttpManager._handle_request_inner``)."""
    tree = src.tree(DUMPER)
    config = _class(tree, "DumperConfig")
    fields = {n.target.id: {"annotation": ast.unparse(n.annotation), "default": ast.literal_eval(n.value)}
              for n in config.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    core: set[str] = set()
    for plugin in ("_SGLangPlugin", "_MegatronPlugin"):
        call = _returned(_method(_class(tree, plugin), "core_fields"))  # frozenset({...})
        core |= set(ast.literal_eval(call.args[0]))
    hooks = _class(tree, "_NonIntrusiveDumper")
    prefix = next(ast.literal_eval(n.value) for n in hooks.body
                  if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_NAME_PREFIX")
    handler = _method(_class(tree, "_DumperHttpManager"), "_handle_request_inner")
    methods = [ast.literal_eval(n.comparators[0]) for n in ast.walk(handler)
               if isinstance(n, ast.Compare) and ast.unparse(n.left) == "method" and isinstance(n.comparators[0], ast.Constant)]
    env_prefix = ast.literal_eval(_returned(_method(config, "_env_prefix")))
    return {"source": DUMPER, "config": fields, "env_prefix": env_prefix, "core_fields": sorted(core),
            "non_intrusive_prefix": prefix, "methods": methods, "route_condition": _dumper_route_condition(src)}


def _dumper_route_condition(src) -> str:
    """The module-level ``if`` of http_server.py under which SGLang registers ``/dumper/{method}`` (an env var)."""
    for node in src.tree(HTTP_SERVER).body:
        if isinstance(node, ast.If) and any(_route(d) and _route(d)[0] == "/dumper/{method}"
                                             for fn in node.body if isinstance(fn, ast.AsyncFunctionDef | ast.FunctionDef)
                                             for d in fn.decorator_list):
            return ast.unparse(node.test)
    return ""

"""The one resolver of extension points: a registry name first, else a dotted path ``pkg.mod.func`` or
``pkg.mod:func`` (nested attributes allowed after the colon), imported with importlib.

A bottom-floor utility: it imports nothing of miles_core. The registries it looks names up in are passed
in by the caller; miles_core/assemble.py resolves every extension point a config names this way at load.
"""

from __future__ import annotations

import importlib
import inspect
import types
from collections.abc import Callable, Mapping
from typing import Any


def resolve_object(path: str, what: str = "function path") -> Any:
    """The object a dotted ``path`` names (``pkg.mod.attr`` or ``pkg.mod:attr.sub``); ValueError naming ``what`` and the path."""
    hint = "expected a dotted path 'pkg.module.function' (or 'pkg.module:function')"
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"{what}: invalid function path {path!r}; {hint}")
    module_name, sep, attrs = path.strip().partition(":")
    if not sep:
        module_name, _, attrs = module_name.rpartition(".")
    if not module_name or not attrs:
        raise ValueError(f"{what} {path!r}: invalid function path; {hint}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{what} {path!r}: cannot import module {module_name!r} ({e}); {hint}") from None
    for attr in attrs.split("."):
        if not hasattr(obj, attr):
            raise ValueError(f"{what} {path!r}: {getattr(obj, '__name__', type(obj).__name__)!r} has no attribute {attr!r}; {hint}")
        obj = getattr(obj, attr)
    return obj


def resolve(path: str, table: Mapping[str, Callable[..., Any]] | None = None, what: str = "function path") -> Callable[..., Any]:
    """table[path], or the callable the dotted ``path`` names; ValueError naming ``what``, the path and the choices."""
    if table and path in table:
        return table[path]
    try:
        obj = resolve_object(path, what)
    except ValueError as e:
        if not table:
            raise
        raise ValueError(f"{e} (or one of {sorted(table)})") from None
    if not callable(obj):
        raise ValueError(f"{what} {path!r} resolves to a non-callable {type(obj).__name__}")
    return obj


def takes_reference_args(fn: Callable[..., Any]) -> bool:
    """True when ``fn`` is written for the reference system: its first parameter is named ``args`` (the
    reference passes its argparse namespace first: ``reward(args, sample)``, ``filter(args, samples)``, ...)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0].name == "args" and params[0].kind != inspect.Parameter.KEYWORD_ONLY


def reference_args(**fields: Any) -> types.SimpleNamespace:
    """The ``args`` a reference-style function receives: our config fields (same names as the reference's
    flags) as attributes. Only the fields the calling stage knows are set; reading another raises
    AttributeError naming it."""
    return types.SimpleNamespace(**fields)

"""Extension points: a registry name first, else a dotted path `package.module.function`
(`package.module:function` also accepted), resolved with importlib."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def resolve_callable(name: str, table: Mapping[str, Callable[..., Any]], what: str) -> Callable[..., Any]:
    """Return table[name], or the attribute a dotted path names; ValueError naming the choices otherwise."""
    if name in table:
        return table[name]
    module_name, _, attr = name.replace(":", ".").rpartition(".")
    hint = f"expected one of {sorted(table)} or a dotted path 'package.module.function'"
    if not module_name or not attr:
        raise ValueError(f"{what}={name!r}: {hint}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{what}={name!r}: cannot import module {module_name!r} ({exc}); {hint}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{what}={name!r}: module {module_name!r} has no callable {attr!r}; {hint}")
    return fn

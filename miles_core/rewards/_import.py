"""Resolve a dotted path (``"pkg.mod:func"`` or ``"pkg.mod.func"``) to a Python object."""

from __future__ import annotations

import importlib
from typing import Any


def load_function(path: str) -> Any:
    """Import ``pkg.mod`` and return its attribute ``func`` (nested attributes allowed after ``:``).

    ``"pkg.mod:func"`` splits at the colon; ``"pkg.mod.func"`` splits at the last dot.
    Raises ``ValueError`` naming ``path`` when it is malformed, the module cannot be imported,
    the attribute is missing or the object is not callable.
    """
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"invalid function path {path!r}: expected 'pkg.mod:func' or 'pkg.mod.func'")
    module_name, sep, attr_path = path.strip().partition(":")
    if not sep:
        module_name, _, attr_path = module_name.rpartition(".")
    if not module_name or not attr_path:
        raise ValueError(f"invalid function path {path!r}: expected 'pkg.mod:func' or 'pkg.mod.func'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} of function path {path!r}: {exc}") from exc
    for attr in attr_path.split("."):
        if not hasattr(obj, attr):
            owner = getattr(obj, "__name__", type(obj).__name__)
            raise ValueError(f"function path {path!r}: {owner!r} has no attribute {attr!r}")
        obj = getattr(obj, attr)
    if not callable(obj):
        raise ValueError(f"function path {path!r} resolves to a non-callable {type(obj).__name__}")
    return obj

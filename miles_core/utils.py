"""Small shared helpers."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def load_function(path: str, registry: dict[str, Callable[..., Any]] | None = None) -> Callable[..., Any]:
    """Resolve a registry name first, then a dotted path ``pkg.mod.func`` or ``pkg.mod:func``."""
    if registry and path in registry:
        return registry[path]
    module_name, _, attr = path.replace(":", ".").rpartition(".")
    if not module_name:
        valid = f"; registry names: {sorted(registry)}" if registry else ""
        raise ValueError(f"cannot resolve {path!r}: expected a dotted path pkg.module.function{valid}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import module {module_name!r} of {path!r}: {e}") from None
    if not hasattr(module, attr):
        raise ValueError(f"module {module_name!r} has no attribute {attr!r} (from {path!r})")
    return getattr(module, attr)

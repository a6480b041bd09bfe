"""Small shared helpers."""

from __future__ import annotations

import importlib
import inspect
import types
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

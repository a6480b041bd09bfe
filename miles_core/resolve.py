"""The one resolver of extension points: a registry name first, else a dotted path ``pkg.mod.func`` or
``pkg.mod:func`` (nested attributes allowed after the colon), imported with importlib.

``check_extension_points(cfg)`` resolves every extension point a config names (custom_rm_path,
custom_loss_function_path, custom_tis_function_path, dynamic_sampling_filter_path, eval_function_path,
custom_reward_post_process_path), so a typo fails at config load,
naming the field, before any model loads.
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


def extension_points(cfg) -> dict[str, tuple[str, Mapping | None]]:
    """{field: (its value, the registry of names it may take)} for every extension point the config sets."""
    from miles_core.algorithms.losses import LOSS_FUNCTIONS
    from miles_core.algorithms.rollout_correction import TIS_FUNCTIONS
    from miles_core.evaluation.suite import EVAL_FUNCTIONS
    from miles_core.rollout.filters import FILTERS

    r, a, e = cfg.rollout, cfg.algo, cfg.eval
    points = {
        "custom_rm_path": (r.custom_rm_path, None), "custom_reward_post_process_path": (r.custom_reward_post_process_path, None),
        "dynamic_sampling_filter_path": (r.dynamic_sampling_filter_path, FILTERS),
        "custom_loss_function_path": (a.custom_loss_function_path, LOSS_FUNCTIONS),
        "custom_tis_function_path": (a.custom_tis_function_path, TIS_FUNCTIONS),
        "eval_function_path": (e.eval_function_path, EVAL_FUNCTIONS),
    }
    return {k: v for k, v in points.items() if v[0]}


def check_extension_points(cfg) -> None:
    for field, (path, table) in extension_points(cfg).items():
        resolve(path, table, field)

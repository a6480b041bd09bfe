"""The value of an env var a page sets (`NAME=value`, `NAME=value cmd`), parsed by the code that reads it.

No grammar of its own: each entry is the function the reading code calls on the variable's text, imported
from that code (``miles_core.faults.parse`` for MILES_FAULT_INJECT, ...). Prefect's settings are parsed by
Prefect's own settings model, the Docker build arguments against the values docker/build.py passes.
Every variable miles reads is either here or in ANY_TEXT (read as free text: nothing to refuse); a test
keeps that true, so a new variable cannot slip past the check.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from . import ROOT

# Variables the code reads as free text (a path, a key, a URL, a switch set to anything): any value is one it takes.
ANY_TEXT = {
    "MILES_CACHE_DIR": "miles_core/env.py: cache_dir(), a directory",
    "MILES_ENGINE_API_KEY": "miles_core/config/rollout.py: engine_api_key(), any text",
    "MILES_ENGINE_FAULT_INJECTION": "miles_core/rollout/http/server.py: set to anything, --enable-fault-injection",
    "MLFLOW_TRACKING_URI": "MLflow's tracking URI (miles_core/evaluation/discover.py)",
    "HF_HUB_OFFLINE": "huggingface_hub: true for 1/ON/YES/TRUE, false for anything else",
    "MALLOC_MMAP_THRESHOLD_": "glibc's (a byte count); miles_core/malloc.py only looks whether it is set",
    "MALLOC_TRIM_THRESHOLD_": "glibc's (a byte count); miles_core/malloc.py only looks whether it is set",
    "WANDB_CACHE_DIR": "miles_core/tracking/wandb_tracker.py: _wandb(), a directory (W&B's temp dirs go beside it)",
}


@lru_cache(maxsize=1)
def parsers() -> dict[str, Callable[[str], Any]]:
    """Variable -> the code's parser of its text (raises ValueError, or pydantic's ValidationError, on a bad value)."""
    from flows import errors
    from miles_core import env, faults
    from miles_core.config.rules_events import ENV_REPORT_ENV, decode_env_report
    from miles_core.tracking import catalog

    return {faults.FAULT_ENV: faults.parse, catalog.CHECK_ENV: catalog.check_mode, env.ALLOW_HUB_ENV: env.allow_hub,
            errors.DEBUG_ENV: errors.debug_value, ENV_REPORT_ENV: decode_env_report}


@lru_cache(maxsize=None)
def problem(name: str, value: str) -> str | None:
    """Why ``value`` is not a value of ``name`` that its reader takes (the reader's own message), or None."""
    parse = parsers().get(name)
    if parse is None and name.startswith("PREFECT_"):
        return _prefect_problem(name, value)
    if parse is None:
        return _build_arg_problem(name, value)
    try:
        parse(value)
    except ValueError as e:  # pydantic's ValidationError is a ValueError too
        return str(e).splitlines()[0]
    return None


def _prefect_problem(name: str, value: str) -> str | None:
    """Prefect's settings model reads the variable, as it does at import: an unknown setting or a bad value fails."""
    from prefect.settings import Settings
    from prefect.settings.legacy import _get_valid_setting_names
    from pydantic import ValidationError

    if name not in _get_valid_setting_names(Settings):
        return f"{name} is not a Prefect setting (prefect {_prefect_version()})"
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        Settings()
    except ValidationError as e:
        return "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors() if err['type'] != "default_factory_not_called")
    finally:
        os.environ.pop(name) if old is None else os.environ.__setitem__(name, old)
    return None


def _prefect_version() -> str:
    import prefect

    return prefect.__version__


def _build_arg_problem(name: str, value: str) -> str | None:
    """A Docker build argument docker/build.py sets per variant: the value must be one a variant passes."""
    values = build_arg_values().get(name)
    if values is None or value in values:
        return None
    return f"docker/build.py passes {name} as {', '.join(sorted(values))} (VARIANTS), not {value}"


@lru_cache(maxsize=1)
def build_arg_values() -> dict[str, set[str]]:
    """Build argument -> the values docker/build.py's VARIANTS pass (loaded from its file: docker/ is no package)."""
    path: Path = ROOT / "docker" / "build.py"
    spec = importlib.util.spec_from_file_location("_docs_docker_build", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    out: dict[str, set[str]] = {}
    for variant in module.VARIANTS.values():
        for arg, v in variant.build_args.items():
            out.setdefault(arg, set()).add(v)
    return out

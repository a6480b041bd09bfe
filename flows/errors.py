"""What the `miles` CLI prints for an error: one short message and where to look, never a wall of
tracebacks. The full traceback only with ``miles --debug ...`` or ``MILES_DEBUG=1``.

Exit codes: 2 for a config or input error (bad field, file, directory, data row, a run dir in use:
``INPUT_ERRORS``), 1 for a failure while running (an engine, a reward service, a full disk).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from miles_core.config import ConfigError
from miles_core.data import DataError

DEBUG_ENV = "MILES_DEBUG"
INPUT_ERRORS: tuple[type[BaseException], ...] = (ConfigError, DataError, FileNotFoundError, NotADirectoryError, IsADirectoryError)
LOW_SPACE_BYTES = 64 * 1024**2


def debug_enabled(flag: bool = False) -> bool:
    return flag or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def exit_code(e: BaseException) -> int:
    return 2 if isinstance(e, INPUT_ERRORS) else 1


def describe(e: BaseException, dirs: dict[str, Path] | None = None) -> list[str]:
    """The lines to print for ``e``; ``dirs`` (run dir, save, export of the run) name a full disk and where to look."""
    if isinstance(e, INPUT_ERRORS):
        return [f"error: {e}"]
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return [f"error: no space left on device: {_full_paths(e, dirs or {})}", *_where(dirs)]
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return [f"error: {type(e).__name__}: {first[:500]}", *_where(dirs)]


def _full_paths(e: OSError, dirs: dict[str, Path]) -> str:
    """The file the write failed on, else the run's directories that are (nearly) out of space."""
    if e.filename:
        return str(e.filename)
    low = [f"{name} {path}" for name, path in dirs.items() if path.exists() and shutil.disk_usage(path).free < LOW_SPACE_BYTES]
    return ", ".join(low) or "a write of this run (its dirs: " + ", ".join(f"{n} {p}" for n, p in dirs.items()) + ")"


def _where(dirs: dict[str, Path] | None) -> list[str]:
    lines = []
    if dirs and "run_dir" in dirs:
        lines.append(f"run dir: {dirs['run_dir']} (the MLflow run there is tagged miles.failure; rerun to resume)")
    lines.append(f"full traceback: miles --debug ... or {DEBUG_ENV}=1")
    return lines

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


def debug_value(text: str) -> bool:
    """MILES_DEBUG's value: any text but empty or 0 turns the full tracebacks on."""
    return text not in ("", "0")


def debug_enabled(flag: bool = False) -> bool:
    return flag or debug_value(os.environ.get(DEBUG_ENV, ""))


def exit_code(e: BaseException) -> int:
    return 2 if isinstance(e, INPUT_ERRORS) else 1


def describe(e: BaseException, dirs: dict[str, Path] | None = None) -> list[str]:
    """The lines to print for ``e``; ``dirs`` (run dir, save, export of the run) name a full disk and where to look."""
    if isinstance(e, INPUT_ERRORS):
        return [f"error: {e}"]
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        from miles_core.checkpoint import DiskFull  # imported here: it brings torch

        if isinstance(e, DiskFull):  # it names the path and the bytes it needed (miles_core/checkpoint/_fs.py)
            return [f"error: {e}", *_where(dirs)]
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
        lines.append(f"run dir: {dirs['run_dir']} ({mlflow_state(dirs['run_dir']) or 'no MLflow run opened'}; rerun to resume)")
    lines.append(f"full traceback: miles --debug ... or {DEBUG_ENV}=1")
    return lines


def mlflow_state(run_dir: Path) -> str | None:
    """What the MLflow run of ``run_dir`` (its mlflow_run.json) says now: its status and failure tags, as read from
    the store (never what a hook was meant to write); None when the dir names no run or the store cannot be read."""
    import json

    marker = Path(run_dir) / "mlflow_run.json"
    try:
        info = json.loads(marker.read_text())
        from miles_core.tracking.mlflow_tracker import mlflow_client

        run = mlflow_client(info["tracking_uri"]).get_run(info["run_id"])
    except Exception:  # no marker, a bad one, or a store that is gone: say nothing rather than guess
        return None
    tags = {k: v for k, v in run.data.tags.items() if k in ("miles.failure", "miles.interrupted", "miles.resume_from_rollout")}
    return f"MLflow run {run.info.run_id} is {run.info.status}" + "".join(f", {k}={v}" for k, v in sorted(tags.items()))

"""One run per run dir: an exclusive ``flock`` on ``<dir>/.miles.lock`` of the run dir and the save dir.

The train flow holds the lock for its whole run; the OS releases it when the process dies (SIGKILL
included), so a crashed run never leaves a stale lock. A second run on the same run dir or save dir
is refused with ``RunDirBusy``, naming the holder's pid and host (written into the lock file by the
holder). ``probe`` checks without holding: the CLI calls it before the flow starts, so a refused run
says so in a second, before any model loads.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from miles_core.config import ConfigError, TrainConfig

LOCK_FILE = ".miles.lock"


class RunDirBusy(ConfigError):
    """Another live process holds the lock of a run dir or save dir."""


def lock_dirs(cfg: TrainConfig) -> list[Path]:
    """The dirs one run owns: its run dir and its save dir (once each, in a fixed order)."""
    return sorted({cfg.run_dir, cfg.save_dir})


@dataclass
class RunLock:
    """The held locks of one run; ``release`` is idempotent."""

    files: list[IO[str]] = field(default_factory=list)

    def release(self) -> None:
        for f in self.files:
            f.close()  # closing the descriptor drops the flock
        self.files.clear()


def _busy(directory: Path) -> RunDirBusy:
    return RunDirBusy(f"{directory} is in use by another miles run: {_holder(directory / LOCK_FILE)}. Wait for it to end, "
                      "or use another --run-dir / --save")


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["started"])) if "started" in info else "?"
    return f"pid {info.get('pid', '?')} on host {info.get('host', '?')} (since {since})"


def _lock_one(directory: Path) -> IO[str]:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_FILE
    f = open(path, "a+")  # noqa: SIM115 (held open for the run: the descriptor is the lock)
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise _busy(directory) from None
    f.seek(0)
    f.truncate()
    f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}))
    f.flush()
    return f


def hold(cfg: TrainConfig) -> RunLock:
    """Lock the run dir and save dir of ``cfg`` (-> the held lock), or raise RunDirBusy naming the holder."""
    lock = RunLock()
    try:
        for directory in lock_dirs(cfg):
            lock.files.append(_lock_one(directory))
    except BaseException:
        lock.release()
        raise
    return lock


def probe(cfg: TrainConfig) -> None:
    """Raise RunDirBusy now if another process holds a lock of ``cfg``'s dirs (nothing stays held)."""
    for directory in lock_dirs(cfg):
        path = directory / LOCK_FILE
        if not path.exists():
            continue
        with open(path) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _busy(directory) from None

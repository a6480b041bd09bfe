"""Sympy equality with a hard time limit, in a small pool of worker processes.

Rule: ``SympyPool.equal(a, b, timeout)`` asks a worker (:mod:`miles_core.rewards.sympy_worker`,
a plain ``python -m`` subprocess talking JSON lines over pipes) whether sympy shows ``a == b``.
An answer later than ``timeout`` seconds counts as "not equal": the worker is killed and a
replacement started at once, so a pathological expression (``9^{9^{9^9}}``) cannot hang a
rollout. Workers start lazily; the time a worker needs to start (import sympy, ~1 s) does not
count against ``timeout``. Nothing in the parent process imports sympy.
Subprocesses rather than ``multiprocessing``: no re-import of the caller's ``__main__``, safe
next to threads, CUDA and notebooks.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

logger = logging.getLogger(__name__)

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding miles_core/


class WorkerError(RuntimeError):
    """A sympy worker failed to start or broke its protocol."""


class _Worker:
    """One ``python -m miles_core.rewards.sympy_worker`` process and its pipes."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "miles_core.rewards.sympy_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=env)
        self.ready = False
        self._pending = b""

    def read_line(self, timeout: float) -> bytes | None:
        """The next line from the worker, None after ``timeout`` s; WorkerError on EOF."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise WorkerError(f"sympy worker exited (code {self.proc.poll()})")
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line

    def wait_ready(self, timeout: float) -> None:
        if self.ready:
            return
        line = self.read_line(timeout)
        if line != b"ready":
            raise WorkerError(f"sympy worker did not start within {timeout:.0f}s (got {line!r})")
        self.ready = True

    def ask(self, a: str, b: str, timeout: float) -> bool | None:
        """The worker's answer, or None when it takes longer than ``timeout`` seconds."""
        self.proc.stdin.write(json.dumps([a, b]).encode() + b"\n")
        line = self.read_line(timeout)
        return None if line is None else line == b"1"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=5)
        self.proc.stdin.close()
        self.proc.stdout.close()


class SympyPool:
    """``size`` lazily started workers; thread-safe (each call checks one worker out)."""

    def __init__(self, size: int, start_timeout: float = 120.0) -> None:
        self._slots: queue.Queue[_Worker | None] = queue.Queue()
        for _ in range(size):
            self._slots.put(None)
        self._size = size
        self._start_timeout = start_timeout

    def equal(self, a: str, b: str, timeout: float) -> bool:
        """Whether sympy shows ``a == b`` within ``timeout`` seconds (False on timeout).

        Raises WorkerError when a worker cannot start at all (a broken environment is loud).
        """
        worker = self._slots.get()
        try:
            worker = worker or _Worker()
            worker.wait_ready(self._start_timeout)
            answer = worker.ask(a, b, timeout)
            if answer is not None:
                return answer
            logger.warning("sympy comparison exceeded %.1fs, worker restarted: %.80r vs %.80r",
                           timeout, a, b)
            worker = _replace(worker)
        except (WorkerError, OSError) as exc:
            if worker is None or not worker.ready:
                worker = _discard(worker)
                raise WorkerError(f"cannot start a sympy worker: {exc}") from exc
            logger.warning("sympy worker failed (%s), restarting it", exc)
            worker = _replace(worker)
        except BaseException:
            worker = _discard(worker)
            raise
        finally:
            self._slots.put(worker)
        return False

    def warm(self) -> None:
        """Start every worker and wait until all have imported sympy."""
        workers = [self._slots.get() for _ in range(self._size)]
        try:
            workers = [w or _Worker() for w in workers]
            for w in workers:
                w.wait_ready(self._start_timeout)
        finally:
            for w in workers:
                self._slots.put(w)

    def close(self) -> None:
        """Stop every idle worker; never waits for busy ones (they end when our pipes close).

        The pool stays usable: workers restart on demand.
        """
        for _ in range(self._size):
            try:
                worker = self._slots.get_nowait()
            except queue.Empty:
                return
            self._slots.put(_discard(worker))


def _discard(worker: _Worker | None) -> None:
    if worker is not None:
        worker.stop()
    return None


def _replace(worker: _Worker) -> _Worker:
    """Kill ``worker`` and start its replacement now, so that it warms up in the background."""
    worker.stop()
    return _Worker()


DEFAULT_POOL_SIZE = max(1, min(4, os.cpu_count() or 1))
_default_pool: SympyPool | None = None
_default_lock = threading.Lock()


def default_pool() -> SympyPool:
    """The process-wide pool (:data:`DEFAULT_POOL_SIZE` = ``min(4, cpu_count)`` workers), created on first use."""
    global _default_pool
    with _default_lock:
        if _default_pool is None:
            _default_pool = SympyPool(size=DEFAULT_POOL_SIZE)
            atexit.register(_default_pool.close)
        return _default_pool

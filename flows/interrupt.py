"""Ctrl-C and SIGTERM on `miles train`: stop in seconds, record it, say what is true.

- The ephemeral Prefect API that a plain `miles train` talks to is Prefect's own subprocess server, but started
  here in its own session (``own_session_api``): a Ctrl-C at the terminal (SIGINT to the whole foreground process
  group) no longer kills it under the flow, so the flow can still report its Crashed state and run its hooks instead
  of retrying a dead API for minutes. It is stopped at exit, after Prefect's log and event workers have drained;
  it dies with this process too (``PR_SET_PDEATHSIG``). `miles train` starts it before its heavy imports.
- The first SIGINT or SIGTERM is recorded; the flow finishes the stage it is in and raises ``Interrupted`` at the
  next stage boundary (``stop_if_interrupted``; raised from the handler, inside Prefect's task engine, it left the
  run's state broken: "Task run is not set"). Every stage writes atomically, and the rerun resumes from the last
  complete checkpoint. The flow's crash hook (flows/hooks.py) ends the MLflow run KILLED with ``miles.failure`` =
  interrupted and ``miles.interrupted`` = the signal. A second signal exits at once (130 / 143).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Iterator

INTERRUPTED = "interrupted"
PR_SET_PDEATHSIG = 1


_PENDING: list[int] = []  # signals received and not yet acted on: process-wide, as signal handlers are
_ARMED: list[bool] = []  # deferred_signals is active (the CLI): the flow puts the handler back over Prefect's bridge


class Interrupted(KeyboardInterrupt):
    """Raised in the flow between stages after SIGINT or SIGTERM (a BaseException: Prefect records a crash, never a
    task failure to retry)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


def signal_name(exc: BaseException) -> str | None:
    """The signal an exception stands for (ours, KeyboardInterrupt: SIGINT, Prefect's TerminationSignal); else None."""
    from prefect.exceptions import TerminationSignal

    if isinstance(exc, Interrupted):
        return signal.Signals(exc.signum).name
    if isinstance(exc, KeyboardInterrupt):
        return "SIGINT"
    if isinstance(exc, TerminationSignal):
        return signal.Signals(exc.signal).name
    return None


def _on_signal(signum, frame) -> None:
    if _PENDING:
        os.write(2, b"\nsecond interrupt: exiting now\n")
        os._exit(128 + signum)
    _PENDING.append(signum)
    os.write(2, f"\n{signal.Signals(signum).name}: stopping after the current stage (Ctrl-C again: exit at once)\n".encode())


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """SIGINT and SIGTERM are recorded, not raised wherever the main thread happens to be (inside Prefect's engine an
    exception there corrupts the run's state): the flow stops at its next stage boundary (``stop_if_interrupted``).
    A second signal exits at once."""
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    _ARMED.append(True)
    try:
        yield
    finally:
        _ARMED.clear()
        _PENDING.clear()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def rearm() -> None:
    """In the flow: under deferred_signals, SIGTERM goes to our handler again (Prefect's flow engine installs its own
    bridge, which raises wherever the main thread is). A deployment's flow run (no deferred_signals) keeps Prefect's."""
    if _ARMED and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_signal)


def stop_if_interrupted() -> None:
    """At a stage boundary of the flow: raise Interrupted when a signal came."""
    if _PENDING:
        raise Interrupted(_PENDING[0])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class OwnSessionAPI:
    """Prefect's ephemeral API server, started with Prefect's own command (prefect/server/api/server.py,
    ``SubprocessASGIServer._run_uvicorn_command``) but in a session of its own: signals to this process group do not
    reach it. Started before the run's heavy imports and waited for when the flow needs it (it takes seconds to
    answer), without importing Prefect's server package here."""

    def __init__(self) -> None:
        self.port = _free_port()  # a port of its own: never the instance Prefect's get_client would start
        self.process: subprocess.Popen | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self) -> None:
        import atexit

        self._spawn()
        atexit.register(self.stop)  # Prefect's log and event workers drain before (threading's exit hook runs first)

    def _spawn(self) -> None:
        import prefect
        from prefect.settings import get_current_settings

        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
               **get_current_settings().to_environment_variables(exclude_unset=True)}
        cmd = [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent), "--factory",
               "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
               "--log-level", "error", "--lifespan", "on"]
        self.process = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_die_with_parent)  # noqa: PLW1509

    def wait_ready(self, timeout_s: float) -> None:
        """Until ``/health`` answers 200; a port taken meanwhile (uvicorn exits 3) is replaced, as Prefect does."""
        import httpx

        deadline = time.monotonic() + timeout_s
        with httpx.Client() as client:
            while True:
                code = self.process.poll()
                if code == 3:
                    self.port = _free_port()
                    self._spawn()
                elif code is not None:
                    raise RuntimeError(f"the ephemeral Prefect API (port {self.port}) exited with code {code} before it answered")
                with contextlib.suppress(httpx.TransportError):
                    if client.get(f"{self.api_url}/health", timeout=5).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the ephemeral Prefect API on port {self.port} did not answer within {timeout_s:.0f} s "
                                       "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)")
                time.sleep(0.1)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_own_session_api() -> OwnSessionAPI | None:
    """With PREFECT_API_URL unset: the ephemeral API, started now (the caller imports what the run needs while it
    comes up); else None (a server is given)."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return None
    api = OwnSessionAPI()
    api.start()
    return api


@contextlib.contextmanager
def own_session_api(api: OwnSessionAPI | None) -> Iterator[None]:
    """The flow's API for the duration: ``api`` once it answers (stopped at exit), or the configured PREFECT_API_URL."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, temporary_settings

    if api is None:
        yield
        return
    api.wait_ready(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
    with temporary_settings({PREFECT_API_URL: api.api_url}):
        yield


def _free_port() -> int:
    import socket

    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

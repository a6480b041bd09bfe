"""Start an engine server: in a background thread of this process, or as a subprocess.

    with serve_in_thread(engine) as handle:            # handle.url, handle.server (EngineServer)
        ...
    with launch_server_process(model_dir, args=["--batching", "dynamic"]) as proc:   # proc.url, proc.pid
        ...
    launch_server_process(model_dir, host=node_ip, api_key=key)   # reachable from other nodes, key required
    procs = [spawn_server_process(model_dir) for _ in range(4)]   # start-ups overlap
    for p in procs:
        p.wait_ready()

A thread server shares this process's GIL and torch thread pool with the caller (cheap to start,
what the tests use); a subprocess server is a real, killable process (what the Ray runtime and the
benchmark use).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path

from miles_core.rollout.hf_engine import HFEngine
from .server import API_KEY_ENV, EngineServer, ServerOptions


class ServerHandle:
    """A server running on its own event loop in a daemon thread."""

    def __init__(self, server: EngineServer, loop: asyncio.AbstractEventLoop, thread: threading.Thread, url: str):
        self.server, self.url = server, url
        self._loop, self._thread = loop, thread

    def call(self, coro, timeout: float = 30.0):
        """Run a coroutine on the server's loop (e.g. a server method) and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        if not self._thread.is_alive():
            return
        self.call(self.server.stop(), timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_in_thread(engine: HFEngine, host: str = "127.0.0.1", port: int = 0, **options) -> ServerHandle:
    """Serve ``engine`` on host:port (0 = any free port) from a daemon thread; ``options`` are
    ServerOptions fields. -> a started handle."""
    loop = asyncio.new_event_loop()
    ready: Future = Future()

    def run() -> None:
        asyncio.set_event_loop(loop)
        server = EngineServer(engine, ServerOptions(**options))
        try:
            bound = loop.run_until_complete(server.start(host, port))
        except BaseException as e:  # report the failure to the caller, then end the thread
            ready.set_exception(e)
            loop.close()
            return
        ready.set_result((server, bound))
        loop.run_forever()
        loop.close()

    thread = threading.Thread(target=run, name="miles-http-server", daemon=True)
    thread.start()
    server, bound = ready.result(timeout=60)
    return ServerHandle(server, loop, thread, f"http://{host}:{bound}")


class ServerProcess:
    """A server subprocess (spawn_server_process); ``url`` is known once wait_ready() returned;
    ``api_key`` is the key it requires (None: none)."""

    def __init__(self, proc: subprocess.Popen, cmd: list[str], port_file: Path, log_path: Path, api_key: str | None = None):
        self.proc, self.cmd, self.port_file, self.log_path = proc, cmd, port_file, log_path  # both in a temp dir
        self.api_key = api_key
        self.url: str | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout_s: float = 120.0) -> "ServerProcess":
        """Block until the server listens (its port file exists). Raises with the log if it died."""
        deadline = time.monotonic() + timeout_s
        while not self.port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"engine server {' '.join(self.cmd)} did not start (exit {self.proc.poll()}):\n{self.log_tail()}")
            time.sleep(0.05)
        self.url = json.loads(self.port_file.read_text())["url"]
        return self

    def log_tail(self, n: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL: the process dies without closing anything (a crash)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; removes the temp dir (port file, log)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self.log_path.parent, ignore_errors=True)

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def spawn_server_process(model_path: str | Path, args: list[str] = (), host: str = "127.0.0.1", port: int = 0,
                         env: dict[str, str] | None = None, api_key: str | None = None) -> ServerProcess:
    """Start ``python -m miles_core.rollout.http.server`` and return at once (see wait_ready):
    start several, then wait for all, and their start-ups overlap. ``host``: the address to bind
    (a node's address for engines other nodes reach); ``api_key``: required on every request but the
    probes, passed in the environment (MILES_ENGINE_API_KEY), never on the command line."""
    workdir = Path(tempfile.mkdtemp(prefix="miles-http-"))
    port_file, log_path = workdir / "port.json", workdir / "server.log"
    cmd = [sys.executable, "-m", "miles_core.rollout.http.server", "--model-path", str(model_path),
           "--host", host, "--port", str(port), "--port-file", str(port_file), *args]
    child_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k != API_KEY_ENV}
    if api_key:
        child_env[API_KEY_ENV] = api_key
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env)
    return ServerProcess(proc, cmd, port_file, log_path, api_key)


def launch_server_process(model_path: str | Path, args: list[str] = (), host: str = "127.0.0.1", port: int = 0,
                          timeout_s: float = 120.0, env: dict[str, str] | None = None,
                          api_key: str | None = None) -> ServerProcess:
    """spawn_server_process + wait_ready: returns once the server listens."""
    return spawn_server_process(model_path, args, host, port, env, api_key).wait_ready(timeout_s)

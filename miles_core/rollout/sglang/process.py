"""One SGLang server as a subprocess: started with launch_command's argv, ready once it answers its probe.

    proc = SGLangProcess.start(cfg, EngineLaunch(model_path=..., host=node_ip, port=free_port(node_ip),
                                                 api_key=key, engine_index=i), log_dir=run_dir / "engines")
    proc.wait_ready(timeout_s=1800)        # GET /health_generate answers 200 (a real model loads for minutes)
    client = HTTPEngineClient(proc.url, **engine_client_options(cfg, key))
    proc.kill()                            # SIGKILL: a crash (the health monitor's restart starts a new one)

The same shape as miles_core/rollout/http/launch.py's ServerProcess (url, pid, alive, kill, stop,
log_tail), so the Ray engine actor can hold either. SGLang reads its key from its command line
(``--api-key``; it has no environment variable for it), so on a shared node other local users can
read it from the process list: the key keeps other machines out, not other users of the node.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from .launch import EngineLaunch, launch_command

if TYPE_CHECKING:
    from miles_core.config import TrainConfig

PROBE = "/health_generate"  # SGLang's readiness probe: 200 once the model is loaded and a decode step runs


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (the caller starts its server right after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class SGLangProcess:
    """A started ``python -m sglang.launch_server``; its output goes to ``log_path``."""

    def __init__(self, proc: subprocess.Popen, cmd: list[str], url: str, log_path: Path):
        self.proc, self.cmd, self.url, self.log_path = proc, cmd, url, log_path

    @classmethod
    def start(cls, cfg: "TrainConfig", spec: EngineLaunch, log_dir: Path, env: dict[str, str] | None = None,
              python: str = sys.executable) -> "SGLangProcess":
        """Start the engine and return at once (start several, then wait_ready on each: their loads overlap)."""
        cmd = launch_command(cfg, spec, python=python)
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"sglang-{spec.engine_index}-{spec.port}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        return cls(proc, cmd, f"http://{spec.host}:{spec.port}", log_path)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout_s: float = 1800.0, poll_s: float = 1.0) -> "SGLangProcess":
        """Block until GET /health_generate answers 200. Raises RuntimeError with the log's tail if the
        process exits first or the timeout passes (the process is then killed)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                raise RuntimeError(f"SGLang engine exited ({self.proc.returncode}) before it was ready: "
                                   f"{' '.join(self._shown_cmd())}\n{self.log_tail()}")
            try:
                if httpx.get(self.url + PROBE, timeout=min(30.0, poll_s * 10)).status_code == 200:
                    return self
            except httpx.TransportError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"SGLang engine at {self.url} not ready after {timeout_s:.0f} s:\n{self.log_tail()}")
            time.sleep(poll_s)

    def _shown_cmd(self) -> list[str]:
        """The command with the API key masked (for messages and logs)."""
        return ["***" if i and self.cmd[i - 1] == "--api-key" else a for i, a in enumerate(self.cmd)]

    def log_tail(self, n: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL (a crash)."""
        if self.alive():
            self.proc.kill()
        self.proc.wait(30)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` (SGLang shuts its scheduler processes down on SIGTERM)."""
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> "SGLangProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

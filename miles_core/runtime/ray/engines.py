"""EngineGroup: M EngineWorker actors, each holding one HTTP engine server process (SGLang protocol;
our HF engine on CPU); the HTTPFleet (rollout/http/fleet.py) routes to them and restarts them.

The actor owns the process: placement (its bundle) and lifetime follow the actor; ``kill`` is the
fault-injection switch (SIGKILL the server: a crash), ``restart`` starts a fresh server at the
same place (a new port: the fleet gives the router's slot a new client, ``EngineRouter.replace_engine``).
With ``MILES_ENGINE_FAULT_INJECTION`` set in the driver, the servers serve POST /debug/fail (tests).
"""

from __future__ import annotations

import os


class EngineWorker:
    def __init__(self, model_path: str, args: list[str], env: dict[str, str]):
        self.model_path, self.args, self.env = model_path, list(args), env
        self.proc = None
        self.start()

    def start(self) -> str:
        from miles_core.rollout.http import launch_server_process

        self.proc = launch_server_process(self.model_path, self.args, env=self.env)
        return self.proc.url

    def url(self) -> str:
        return self.proc.url

    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.proc.poll() is None

    def kill(self) -> None:
        self.proc.kill()

    def restart(self) -> str:
        self.proc.stop()
        return self.start()

    def stop(self) -> None:
        self.proc.stop()


def hf_server_args(cfg, num_threads: int) -> list[str]:
    """Arguments of our HTTP engine server (python -m miles_core.rollout.http.server)."""
    return ["--dtype", cfg.misc.dtype, "--num-threads", str(num_threads), "--batching", "exact"]


ENGINE_SERVERS = {"hf": hf_server_args}  # by rollout_engine: the server each engine actor runs


class EngineGroup:
    """The engine actors of a run (the HTTPFleet's launcher: urls, restart, dead, shutdown)."""

    def __init__(self, cfg, model_path: str, pg, bundles: list[int], resources: dict[str, float], server_args):
        import ray

        from miles_core.rollout.http.server import FAULT_ENV

        from .placement import in_bundle

        threads = cfg.cluster.num_threads or 1
        env = {"OMP_NUM_THREADS": str(threads), **{k: os.environ[k] for k in (FAULT_ENV,) if k in os.environ}}
        cls = ray.remote(EngineWorker)
        self.workers = [cls.options(**resources, **in_bundle(pg, b)).remote(str(model_path), server_args(cfg, threads), env)
                        for b in bundles]
        self.urls = ray.get([w.url.remote() for w in self.workers])
        self.bucket_bytes = cfg.cluster.update_weight_buffer_size

    def client(self, url: str):
        """A client like the router's (fails fast: the router fails over)."""
        from miles_core.rollout.http import HTTPEngineClient

        return HTTPEngineClient(url, max_retries=1, backoff_s=0.05, bucket_bytes=self.bucket_bytes)

    def restart(self, i: int) -> str:
        """Kill engine i's server (if still running) and start a fresh one at the same place. -> its URL."""
        import ray

        self.urls[i] = ray.get(self.workers[i].restart.remote())
        return self.urls[i]

    def dead(self) -> list[int]:
        """Engines whose server process exited."""
        import ray

        return [i for i, ok in enumerate(ray.get([w.alive.remote() for w in self.workers])) if not ok]

    def shutdown(self) -> None:
        import ray

        try:
            ray.get([w.stop.remote() for w in self.workers], timeout=30)
        finally:
            for w in self.workers:
                ray.kill(w)

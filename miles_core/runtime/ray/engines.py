"""EngineGroup: M EngineWorker actors, each holding one HTTP engine server process (SGLang protocol;
our HF engine on CPU); the HTTPFleet (rollout/http/fleet.py) routes to them and restarts them.

The actor owns the process: placement (its bundle) and lifetime follow the actor; ``kill`` is the
fault-injection switch (SIGKILL the server: a crash), ``restart`` starts a fresh server at the
same place (a new port: the fleet gives the router's slot a new client, ``EngineRouter.replace_engine``).
With ``MILES_ENGINE_FAULT_INJECTION`` set in the driver, the servers serve POST /debug/fail (tests).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ServerSpec:
    """What an engine actor needs to start its server: the config, the model, this engine's index, the run's
    API key, the env of the server process, and the host to bind (127.0.0.1: one machine; a placement across
    nodes binds the node's address)."""

    cfg: object
    model_path: str
    index: int
    api_key: str
    env: dict
    host: str = "127.0.0.1"
    devices: str | None = None  # CUDA_VISIBLE_DEVICES of the server: the GPUs of this engine's bundles (placement.py)

    def server_env(self) -> dict:
        return self.env if self.devices is None else {**self.env, "CUDA_VISIBLE_DEVICES": self.devices}


def hf_server_args(cfg) -> list[str]:
    """The arguments of our server for this config: dtype, device (resolved in the server process, on the actor's
    own GPU when it has one), threads, exact batching; the base's CPU backup with lora_base_cpu_backup; /metrics with
    use_miles_dashboard (its scraper reads them)."""
    threads = cfg.cluster.num_threads or 1
    return (["--dtype", cfg.misc.dtype, "--device", cfg.cluster.device, "--num-threads", str(threads), "--batching", "exact",
             "--tp-size", str(cfg.cluster.rollout_num_gpus_per_engine)] + ["--enable-weights-cpu-backup"] * cfg.lora.lora_base_cpu_backup
            + ["--enable-metrics"] * cfg.tracking.use_miles_dashboard)


def start_hf_server(spec: ServerSpec):
    """Our SGLang-protocol server (python -m miles_core.rollout.http.server) on an HF engine."""
    from miles_core.rollout.http import launch_server_process

    return launch_server_process(spec.model_path, hf_server_args(spec.cfg), host=spec.host, env=spec.server_env(),
                                 api_key=spec.api_key)


def start_sglang_server(spec: ServerSpec):
    """python -m sglang.launch_server with the config's passthrough arguments (rollout/sglang/launch.py); with the
    inference dumps on, SGLang's DUMPER_* environment (miles_core/rollout/dumper.py sglang_env: its /dumper/{method} route on
    the server's port, the hook mode, the source patcher's YAML)."""
    from miles_core.rollout.dumper import sglang_env
    from miles_core.rollout.sglang.launch import EngineLaunch, require_sglang
    from miles_core.rollout.sglang.process import SGLangProcess, free_port

    require_sglang(spec.cfg)
    launch = EngineLaunch(model_path=spec.model_path, host=spec.host, port=free_port(spec.host), api_key=spec.api_key,
                          engine_index=spec.index)
    env = {**spec.server_env(), **sglang_env(spec.cfg)}
    return SGLangProcess.start(spec.cfg, launch, spec.cfg.run_dir / "engines", env=env).wait_ready()


ENGINE_SERVERS = {"hf": start_hf_server, "sglang": start_sglang_server}  # by rollout_engine: the server each engine actor runs


class EngineWorker:
    """One engine actor: it owns its server process (started by one of ENGINE_SERVERS)."""

    def __init__(self, spec: ServerSpec, start):
        self.spec, self._start = spec, start
        self.proc = None
        self.start()

    def start(self) -> str:
        self.proc = self._start(self.spec)
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


class EngineGroup:
    """The engine actors of a run (the HTTPFleet's launcher: urls, restart, dead, shutdown)."""

    def __init__(self, cfg, model_path: str, pg, plan, start):
        import ray

        from miles_core.rollout.http.options import client_options
        from miles_core.rollout.http.server import FAULT_ENV
        from miles_core.rollout.sglang.launch import new_api_key

        from .placement import engine_devices, in_bundle, placed_engine_hosts

        threads = cfg.cluster.num_threads or 1
        env = {"OMP_NUM_THREADS": str(threads), **{k: os.environ[k] for k in (FAULT_ENV,) if k in os.environ}}
        self.api_key = new_api_key()  # one per run: every engine requires it, the router and weight syncs send it
        cls = ray.remote(EngineWorker)
        bundles = plan.engine_bundles
        self.hosts = placed_engine_hosts(pg, bundles)  # 127.0.0.1 on one node, else each node's address
        self.devices = engine_devices(plan, pg)  # before the engine actors take their bundles
        self.workers = [cls.options(**plan.engine_resources(), **in_bundle(pg, b)).remote(
                            ServerSpec(cfg=cfg, model_path=str(model_path), index=j, api_key=self.api_key, env=env,
                                       host=self.hosts[j], devices=self.devices[j]), start)
                        for j, b in enumerate(bundles)]
        try:
            self.urls = ray.get([w.url.remote() for w in self.workers])
        except BaseException:
            for w in self.workers:  # an engine that failed to start frees its bundle
                ray.kill(w)
            raise
        self._client_options = client_options(cfg, self.api_key)

    def client(self, url: str):
        """A client of the router's (fails fast: the router fails over; the run's key and read timeout)."""
        from miles_core.rollout.http import HTTPEngineClient

        return HTTPEngineClient(url, **self._client_options)

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

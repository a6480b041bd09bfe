"""EngineGroup: M EngineWorker actors, each holding one HTTP engine server process (SGLang protocol;
our HF engine on CPU), behind one EngineRouter (least-loaded, failover; rollout/http/router.py).

The actor owns the process: placement (its bundle) and lifetime follow the actor; ``kill`` is the
fault-injection switch (SIGKILL the server: a crash), ``restart`` starts a fresh server at the
same place (a new port: the group rebuilds the router's client list).
"""

from __future__ import annotations




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


def server_args(cfg, num_threads: int) -> list[str]:
    return ["--dtype", cfg.misc.dtype, "--num-threads", str(num_threads), "--batching", "exact"]


class EngineGroup:
    def __init__(self, cfg, model_path: str, pg, bundles: list[int], resources: dict[str, float]):
        import ray

        from miles_core.rollout.http import EngineRouter

        from .placement import in_bundle

        threads = cfg.cluster.num_threads or 1
        env = {"OMP_NUM_THREADS": str(threads)}
        cls = ray.remote(EngineWorker)
        self.workers = [cls.options(**resources, **in_bundle(pg, b)).remote(str(model_path), server_args(cfg, threads), env)
                        for b in bundles]
        self.urls = ray.get([w.url.remote() for w in self.workers])
        self.bucket_bytes = cfg.cluster.update_weight_buffer_size
        self.router = EngineRouter.from_urls(self.urls, {"bucket_bytes": self.bucket_bytes}, bucket_bytes=self.bucket_bytes)
        self.restarts = 0

    def restart_dead(self) -> int:
        """Restart every engine whose process died; rebuild the router if any did. -> how many."""
        import ray

        from miles_core.rollout.http import EngineRouter

        alive = ray.get([w.alive.remote() for w in self.workers])
        dead = [i for i, ok in enumerate(alive) if not ok]
        if not dead:
            return 0
        new = ray.get([self.workers[i].restart.remote() for i in dead])
        for i, url in zip(dead, new):
            self.urls[i] = url
        self.router.close()
        self.router = EngineRouter.from_urls(self.urls, {"bucket_bytes": self.bucket_bytes}, bucket_bytes=self.bucket_bytes)
        self.restarts += len(dead)
        return len(dead)

    def shutdown(self) -> None:
        import ray

        self.router.close()
        try:
            ray.get([w.stop.remote() for w in self.workers], timeout=30)
        finally:
            for w in self.workers:
                ray.kill(w)




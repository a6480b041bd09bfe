"""HTTPFleet: rollout engines behind an EngineRouter, speaking the SGLang HTTP protocol (our server on CPU,
SGLang's on GPU, or engines already running at given addresses), as one EngineFleet (rollout/fleet.py).

Weight sync: ``WeightSync`` in mode tensor / broadcast / disk (weights/sync.py). With ``offload_tags``
(offload_rollout: by default when colocated) the engines release those memory kinds for the train stage and
resume them (weights first) at the sync. With a launcher (the
placement's engine actors) the fleet can restart engines: dead ones at each sync, and, with a health
monitor (``use_fault_tolerance``), at any time (without one, external engines, the monitor marks them dead): a restarted engine gets the current weights before it
rejoins the router, or, while the trainer is ahead of the engines, waits out of generate (version -1) for
the next sync. ``_weights_lock`` orders monitor rounds, the train stage's start and syncs; ``_fresh``: the
trainer's weights are those the engines serve.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Protocol

from .router import EngineRouter

ALL_MEMORY = ["weights", "kv_cache", "cuda_graph"]
log = logging.getLogger(__name__)


class EngineLauncher(Protocol):
    """The processes behind the engines (e.g. the Ray placement's engine actors)."""

    urls: list[str]

    def restart(self, i: int) -> str: ...  # kill engine i's server if running, start a fresh one -> its URL
    def dead(self) -> list[int]: ...  # engines whose server process exited
    def shutdown(self) -> None: ...


class HTTPFleet:
    def __init__(self, router: EngineRouter, weight_sync, *, offload_tags: list[str], launcher: EngineLauncher | None = None,
                 client: Callable[[str], object] | None = None):
        bad = set(offload_tags) - set(ALL_MEMORY)
        if bad:
            raise ValueError(f"offload tags {sorted(bad)}: expected some of {ALL_MEMORY}")
        self.router, self.weight_sync = router, weight_sync
        self.offload_tags = [t for t in ALL_MEMORY if t in offload_tags]  # what the engines release for the train stage
        self.launcher, self._client = launcher, client
        self._weights_lock = threading.Lock()
        self._fresh = True  # trainer weights == what the engines serve (true at start: both load hf_checkpoint)
        self._released = False
        self._restarts = 0
        self._source = None  # the weight source of the last sync (a restarted engine reloads from it)
        self._version = 0
        self.monitor = None

    @property
    def engine(self) -> EngineRouter:
        """The router; with the weight sync's lora_adapter, every request runs through the adapter (rollout/adapters.py)."""
        if self.weight_sync.lora_adapter:
            from miles_core.weights.sync import LORA_ADAPTER_NAME

            from ..adapters import ThroughAdapter

            return ThroughAdapter(self.router, LORA_ADAPTER_NAME)
        return self.router

    @property
    def restarts(self) -> int:
        return self._restarts

    def watch(self, interval_s: float, timeout_s: float, first_wait_s: float = 0.0) -> None:
        """Start a health monitor (first round after first_wait_s, then every interval_s): an engine failing
        /health_generate is restarted (with a launcher), or, without one (external engines), marked dead: out of the
        router until a probe finds it serving again."""
        from .health import HealthMonitor

        on_dead = self._recover_engine if self.launcher is not None else self._mark_dead
        self.monitor = HealthMonitor(lambda: [s.url for s in self.router.slots], on_dead, interval_s, timeout_s,
                                     self._weights_lock, busy=lambda: self._released, first_wait_s=first_wait_s).start()

    def _mark_dead(self, i: int) -> None:
        url = self.router.slots[i].url
        log.error("engine %s failed its health check; it was not launched by miles, so it is not restarted: restart it "
                  "yourself, it rejoins at the next weight sync", url)
        self.router.mark_dead(i, f"external engine {url} failed its health check (miles cannot restart it)")

    def before_train(self) -> None:
        with self._weights_lock:
            self._fresh = False  # from here the trainer is ahead of the engines
            if self.offload_tags and not self._released:
                self.router.release_memory_occupation(self.offload_tags)
                self._released = True

    def update_weights(self, source, version: int) -> dict[str, float]:
        """Restart dead engines, resume released memory (weights first), then the source's weights -> every
        engine (``version``) in the configured mode."""
        with self._weights_lock:
            self._restart_dead()
            if self._released and "weights" in self.offload_tags:
                self.router.resume_memory_occupation(["weights"])
            metrics = self.weight_sync.sync(source, self.router, version)
            self._source, self._version = source, version
            rest = [t for t in self.offload_tags if t != "weights"]
            if self._released and rest:
                self.router.resume_memory_occupation(rest)
            self._released = False
            self._fresh = True
        return {**metrics, "rollout/engine_restarts": float(self._restarts)}

    def _restart_dead(self) -> None:
        """Every engine whose process died, restarted into the router without weights (version -1: out of
        generate until the sync that follows reaches it)."""
        if self.launcher is None:
            return
        for i in self.launcher.dead():
            self.router.replace_engine(i, self._client(self._restart(i)), version=-1)

    def _restart(self, i: int) -> str:
        url = self.launcher.restart(i)
        self._restarts += 1
        return url

    def _recover_engine(self, i: int) -> None:
        """Health monitor (holds _weights_lock): restart engine i; load the served weights into it when the
        trainer still has them, else leave it out of generate (version -1) until the next sync."""
        url = self._restart(i)
        version = -1
        if self._fresh and self._source is None:
            version = self._version  # no sync yet: the new server loaded hf_checkpoint, the trainer's weights too
        elif self._fresh:
            try:
                with EngineRouter([self._client(url)], bucket_bytes=self.weight_sync.bucket_bytes) as one:
                    self.weight_sync.sync(self._source, one, self._version)
                version = self._version
            except Exception:  # noqa: BLE001 - the engine still joins, out of generate until the next sync reaches it
                log.exception("engine %d restarted but loading weights version %d into it failed", i, self._version)
        self.router.replace_engine(i, self._client(url), version)

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        self.weight_sync.close()
        self.router.close()
        if self.launcher is not None:
            self.launcher.shutdown()

"""HealthMonitor: a driver thread that polls every engine's GET /health_generate (use_fault_tolerance).

``first_wait_s`` after it starts (rollout_health_check_first_wait: engines still compiling kernels), then every
``interval_s``, it checks each engine with a timeout of ``timeout_s``; an engine that does not
answer 200 in time (process gone, hung, failing) is dead: ``on_dead(i)`` kills and restarts it (the
runtime loads the current weights into the new server before the router sends it requests), or, for an
engine miles did not launch, marks it dead in the router. A
round is skipped while ``busy()`` says the engines are legitimately not serving (memory released
when colocated, a weight sync in progress). Errors of a round are logged, never raised: the next
round tries again.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger(__name__)


class HealthMonitor:
    def __init__(self, urls: Callable[[], list[str]], on_dead: Callable[[int], None], interval_s: float, timeout_s: float,
                 round_lock: threading.Lock, busy: Callable[[], bool] = lambda: False, first_wait_s: float = 0.0):
        self.urls, self.on_dead, self.busy = urls, on_dead, busy
        self.interval_s, self.timeout_s, self.first_wait_s = interval_s, timeout_s, first_wait_s
        self.round_lock = round_lock  # held for a whole round; a round is skipped if someone else holds it
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="miles-health-monitor", daemon=True)

    def start(self) -> "HealthMonitor":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.timeout_s + 5)

    def check(self) -> list[int]:
        """Engines that fail the health check now."""
        from concurrent.futures import ThreadPoolExecutor

        from miles_core.rollout.http import HTTPEngineClient

        def ok(url: str) -> bool:
            with HTTPEngineClient(url, max_retries=0, health_timeout_s=self.timeout_s) as c:
                return c.health()

        urls = self.urls()
        with ThreadPoolExecutor(len(urls)) as pool:
            return [i for i, good in enumerate(pool.map(ok, urls)) if not good]

    def run_round(self) -> list[int]:
        """One round: check, restart the dead. -> the engines restarted ([] if skipped)."""
        if not self.round_lock.acquire(blocking=False):
            return []
        try:
            if self.busy():
                return []
            dead = self.check()
            for i in dead:
                log.warning("engine %d (%s) failed its health check within %ss", i, self.urls()[i], self.timeout_s)
                self.on_dead(i)
            self.rounds += 1
            return dead
        finally:
            self.round_lock.release()

    def _loop(self) -> None:
        wait = self.first_wait_s
        while not self._stop.wait(wait):
            wait = self.interval_s
            try:
                self.run_round()
            except Exception:  # noqa: BLE001 - a monitor must outlive a bad round; logged with its traceback
                log.exception("health monitor round failed")

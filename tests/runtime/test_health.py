"""HealthMonitor without Ray: real in-thread servers, one made to hang; rounds skipped while busy."""

from __future__ import annotations

import threading

import httpx
import torch

from miles_core.rollout.http import HFEngine, serve_in_thread
from miles_core.rollout.http.health import HealthMonitor


def test_hung_engine_is_dead_and_rounds_skip_when_busy(tiny_model_dir):
    torch.set_num_threads(1)
    handles = [serve_in_thread(HFEngine.from_pretrained(tiny_model_dir, batching="exact"), enable_fault_injection=True) for _ in range(2)]
    try:
        dead: list[int] = []
        busy = {"on": True}
        lock = threading.Lock()
        mon = HealthMonitor(lambda: [h.url for h in handles], dead.append, interval_s=60, timeout_s=1.0, round_lock=lock,
                            busy=lambda: busy["on"])
        httpx.post(handles[1].url + "/debug/fail", json={"mode": "hang", "on": "now"})
        assert mon.run_round() == [] and mon.rounds == 0  # busy (memory released / a sync): skipped
        busy["on"] = False
        with lock:  # someone else holds the round lock: skipped
            assert mon.run_round() == []
        assert mon.run_round() == [1] and dead == [1] and mon.rounds == 1
        httpx.post(handles[1].url + "/debug/fail", json={"mode": "none"})
        assert mon.check() == []
    finally:
        for h in handles:
            h.stop()


def test_the_first_round_waits_rollout_health_check_first_wait():
    """The reference's --rollout-health-check-first-wait: the first round first_wait_s after start, then every interval_s."""
    import time

    for first_wait, expect in ((0.0, True), (60.0, False)):
        rounds = threading.Event()
        mon = HealthMonitor(lambda: [], lambda i: None, interval_s=60, timeout_s=1.0, round_lock=threading.Lock(),
                            busy=lambda: rounds.set() or True, first_wait_s=first_wait).start()  # busy: a round began
        t0 = time.monotonic()
        assert rounds.wait(2.0) is expect, first_wait
        assert not expect or time.monotonic() - t0 < 2.0
        mon._stop.set()  # the thread exits at its next wait; no join on a 60 s wait

"""`miles stop` against processes that behave like Prefect's process worker on SIGINT: they stay up (the real
worker's own shutdown takes tens of seconds). An idle one is killed after IDLE_WORKER_GRACE_S; one with a child
(a flow run) is left its grace for the child to end."""

from __future__ import annotations

import subprocess
import sys
import time

from flows.serve import IDLE_WORKER_GRACE_S, _alive, _children, stop

IGNORE_SIGINT = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "


def _worker(d, code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", IGNORE_SIGINT + code], start_new_session=True)
    (d / "worker.pid").write_text(str(proc.pid))
    return proc


def test_an_idle_worker_that_outlives_its_sigint_is_killed_after_the_idle_grace(tmp_path):
    proc = _worker(tmp_path, "time.sleep(600)")
    time.sleep(0.5)
    t0 = time.monotonic()
    assert stop(tmp_path, timeout_s=120) == [f"worker (pid {proc.pid})"]
    assert not _alive(proc.pid)  # (stop reaps it: no exit status left for proc.wait)
    assert time.monotonic() - t0 < 60  # the grace is 3 s, the timeout 120 s: 20x margin
    assert not (tmp_path / "worker.pid").exists()


def test_a_worker_with_a_flow_run_child_gets_the_grace_for_it(tmp_path):
    # the child (in the worker's group, so it gets the SIGINT too, and ignores it) ends by itself after 8 s
    child = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {IGNORE_SIGINT + 'time.sleep(8)'!r}]); "
    proc = _worker(tmp_path, child + "time.sleep(600)")
    deadline = time.monotonic() + 30
    while not _children(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _children(proc.pid), "the stand-in worker did not start its child"
    t0 = time.monotonic()
    stop(tmp_path, timeout_s=120)
    waited = time.monotonic() - t0
    assert not _alive(proc.pid)
    assert waited > IDLE_WORKER_GRACE_S + 2  # not killed at the idle grace while its child ran

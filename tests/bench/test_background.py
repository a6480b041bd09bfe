"""The background harness: the machine monitor tells other processes' CPU from ours, the quiet gate waits
for it, and detached background runs queue on the bench lock, record the gate, can be stopped, and give up
on a busy machine when told to. Real processes throughout (spinning Python loops, detached runs of the
cheapest benchmark, matmul-peak at small sizes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.monitor import MachineMonitor, children, tree_cpu_s, wait_for_quiet

ROOT = Path(__file__).resolve().parents[2]
SPIN = "import time\nt = time.time()\nwhile time.time() - t < {s}: pass\n"

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the machine monitor reads /proc (Linux)")


def _outside_spinner(seconds: float) -> int:
    """A busy Python process that is not our descendant (its shell parent exits: it is reparented). -> pid."""
    out = subprocess.check_output(["sh", "-c", f'{sys.executable} -c "{SPIN.format(s=seconds)}" >/dev/null 2>&1 & echo $!'])
    return int(out)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` alone (utime + stime from /proc/<pid>/stat)."""
    return tree_cpu_s(pid) - sum(tree_cpu_s(c) for c in children(pid))


def _descendants(pid: int) -> set[int]:
    todo, seen = [pid], set()
    while todo:
        p = todo.pop()
        seen.add(p)
        todo += [c for c in children(p) if c not in seen]
    return seen - {pid}


def _until_cpu(pid: int, seconds: float, timeout_s: float = 60.0) -> None:
    """Wait until ``pid`` has used ``seconds`` of CPU (however loaded the machine is)."""
    deadline = time.monotonic() + timeout_s
    while _cpu_s(pid) < seconds:
        assert time.monotonic() < deadline, f"pid {pid} got no CPU in {timeout_s} s"
        time.sleep(0.05)


def test_the_monitor_counts_another_process_as_other_and_our_child_as_ours():
    """What the monitor attributes, not how the machine shares its CPUs (a busy machine gives either process any
    share): CPU seconds a descendant used are in ``ours``; those of a process outside our tree never are."""
    outside = _outside_spinner(60)
    child = subprocess.Popen([sys.executable, "-c", SPIN.format(s=60)])
    try:
        _until_cpu(outside, 0.3)
        _until_cpu(child.pid, 0.3)
        own = time.process_time()
        ours, child_cpu = tree_cpu_s(), _cpu_s(child.pid)
        assert child.pid in _descendants(os.getpid()) and outside not in _descendants(os.getpid())
        assert ours >= own + child_cpu - 0.05 and child_cpu >= 0.3  # the child's CPU seconds are counted as ours
        assert _cpu_s(outside) >= 0.3  # the outside spinner ran, outside the tree ours is summed over
        with MachineMonitor(interval_s=0.25) as mon:
            time.sleep(1.0)
        summary = mon.summary()
        assert summary["samples"] >= 2 and all(s["other"] == max(0.0, s["total"] - s["ours"]) for s in mon.samples)
    finally:
        _kill(outside)
        child.kill(), child.wait()


def test_the_quiet_gate_waits_on_what_the_monitor_counts_as_other_and_passes_when_that_is_allowed():
    """The gate's decisions on what the monitor attributes, never on how busy the machine happens to be: a limit no
    sample can meet (other CPU below 0 cores) keeps it waiting to its timeout while an outside process's CPU seconds
    are all counted as other; a limit every sample meets (more cores than the machine has) passes after one window."""
    pid = _outside_spinner(30)
    try:
        _until_cpu(pid, 0.1)
        t_before, before = time.monotonic(), _cpu_s(pid)
        with MachineMonitor(interval_s=0.25) as mon:
            busy = wait_for_quiet(max_other_cores=0.0, window_s=1.0, timeout_s=2.0, interval_s=0.25)
        spun, wall = _cpu_s(pid) - before, time.monotonic() - t_before
    finally:
        _kill(pid)
    assert busy["quiet"] is False and busy["waited_s"] >= 2.0
    times = [0.0] + [s["t"] for s in mon.samples]
    other_s = sum(s["other"] * (t1 - t0) for s, t0, t1 in zip(mon.samples, times, times[1:]))
    # The samples span [0, last t]; the rest of the wall time (before the monitor's first read, after its last
    # sample) the one-threaded spinner could use at most as many CPU seconds as it lasted. Clock ticks: 10 ms each.
    uncovered = wall - times[-1]
    assert spun > 0 and other_s >= spun - uncovered - 0.1, (other_s, spun, uncovered)  # the spinner's seconds are "other"
    roomy = float(os.cpu_count() + 1)
    calm = wait_for_quiet(max_other_cores=roomy, window_s=1.0, timeout_s=20.0, interval_s=0.25, max_steal_cores=roomy)
    assert calm["quiet"] is True and calm["waited_s"] >= 1.0  # a whole window of samples, every one under the limits


def _bench(env: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180, check=check)


@pytest.fixture
def bench_env(tmp_path):
    return {**os.environ, "MILES_BENCH_RESULTS": str(tmp_path / "results"), "MILES_BENCH_STATE_DIR": str(tmp_path / "state")}


def _states(env: dict) -> list[dict]:
    return json.loads(_bench(env, "bg", "status", "--json").stdout)


def test_background_runs_queue_on_the_lock_and_record_the_gate_and_the_result(bench_env, tmp_path):
    roomy = str(os.cpu_count() + 1)  # more cores than the machine has: passes at once, however busy it is
    gate = ["--max-other-cores", roomy, "--max-steal-cores", roomy, "--quiet-window", "0.5"]
    _bench(bench_env, "bg", "start", *gate, "--", "matmul-peak", "--size", "256", "--repeats", "3")
    _bench(bench_env, "bg", "start", *gate, "--", "matmul-peak", "--size", "128", "--repeats", "3")
    for s in _states(bench_env):
        assert _bench(bench_env, "bg", "wait", "--id", s["id"], "--timeout", "150").returncode == 0
    first, second = _states(bench_env)
    assert [first["state"], second["state"]] == ["done", "done"] and first["rc"] == second["rc"] == 0
    assert first["quiet"]["quiet"] is True and second["quiet"]["quiet"] is True
    assert second["lock_at"] >= first["finished_at"]  # the second waited for the first: never two at once
    assert "another benchmark holds the lock" in Path(second["log"]).read_text()
    result = json.loads((tmp_path / "results" / "matmul_peak.json").read_text())
    assert result["config"]["sizes"] == [64, 128, 256]  # the second run's, written where MILES_BENCH_RESULTS says
    assert result["machine"]["interference"]["available"] is True
    assert "while it ran: " in (tmp_path / "results" / "matmul_peak.md").read_text()


def test_a_bad_benchmark_command_fails_in_the_foreground_and_starts_nothing(bench_env, tmp_path):
    out = _bench(bench_env, "bg", "start", "--", "no-such-bench", check=False)
    assert out.returncode == 2 and "invalid choice" in out.stderr
    assert not list((tmp_path / "state").glob("runs/*.json"))


def test_a_run_that_requires_quiet_gives_up_on_a_busy_machine(bench_env):
    # other CPU is never below 0 cores: the gate cannot pass
    _bench(bench_env, "bg", "start", "--max-other-cores", "0", "--quiet-window", "0.5", "--quiet-timeout", "1",
           "--require-quiet", "--", "matmul-peak", "--size", "64", "--repeats", "1")
    done = _bench(bench_env, "bg", "wait", "--timeout", "60", check=False)
    assert done.returncode == 3
    (state,) = _states(bench_env)
    assert state["state"] == "gave-up" and state["quiet"]["quiet"] is False and "started_at" not in state


def test_stop_ends_a_waiting_run_and_frees_the_lock(bench_env, monkeypatch):
    from bench import background

    _bench(bench_env, "bg", "start", "--max-other-cores", "0", "--quiet-timeout", "600", "--", "matmul-peak")
    deadline = time.monotonic() + 60
    while _states(bench_env)[0]["state"] != "waiting-for-quiet":
        assert time.monotonic() < deadline, _states(bench_env)
        time.sleep(0.2)
    pid = _states(bench_env)[0]["pid"]
    _bench(bench_env, "bg", "stop")
    (state,) = _states(bench_env)
    assert state["state"] == "stopped" and not background._alive(pid)
    # the lock is free again: a foreground run starts at once instead of announcing that it waits
    monkeypatch.setenv("MILES_BENCH_STATE_DIR", bench_env["MILES_BENCH_STATE_DIR"])
    with background.bench_lock(["test"], announce=lambda *a, **k: pytest.fail("the lock is still held")):
        assert json.loads((Path(bench_env["MILES_BENCH_STATE_DIR"]) / "lock").read_text())["pid"] == os.getpid()

"""How busy the machine is while a benchmark runs, apart from the benchmark itself.

The load average says little on a 2-vCPU VM (it counts kernel threads in D state: ~1.0 when idle
here). What distorts a benchmark is CPU used by *other* processes, and time the hypervisor takes
away (steal). ``MachineMonitor`` samples, from a background thread every ``interval_s``:

    total   busy CPU of the whole machine (/proc/stat: user + nice + system + irq + softirq), in cores
    ours    CPU of this process and all its descendants (the ephemeral Prefect API, Ray workers, ...)
    other   total - ours: everything else on the machine, in cores
    steal   time the hypervisor ran someone else on our vCPUs, in cores

A sample costs well under a millisecond (a few /proc reads), so the monitor does not disturb what it
watches. ``wait_for_quiet`` uses the same samples as a gate: it returns once ``other`` and ``steal``
stayed below their thresholds for a window of time (or says that it gave up). Linux only; elsewhere both report
``available: False``.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_available() -> bool:
    return Path("/proc/stat").exists()


def machine_cpu_s() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine since boot, from the aggregate line of /proc/stat."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK


def children(pid: int) -> list[int]:
    """Pids of the live child processes of ``pid`` (from every thread's /proc children list)."""
    out = []
    for f in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(p) for p in f.read_text().split()]
        except OSError:
            continue
    return out


def tree_cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) of ``pid`` (default: this process) and every live descendant."""
    total, todo, seen = 0.0, [pid or os.getpid()], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # it exited between the listing and the read
            continue
        total += (int(fields[11]) + int(fields[12])) / CLK_TCK
        todo += children(p)
    return total


class MachineMonitor:
    """Background sampler of total / ours / other / steal CPU (in cores) at ``interval_s``; a context manager."""

    def __init__(self, interval_s: float = 0.5, pid: int | None = None):
        self.interval_s, self.pid = interval_s, pid
        self.samples: list[dict[str, float]] = []  # {t, total, ours, other, steal}: cores averaged over the interval
        self.available = proc_available()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "MachineMonitor":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        if not self.available or self._thread is not None:
            return
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="bench-machine-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def _read(self) -> tuple[float, float, float, float]:
        busy, steal = machine_cpu_s()
        return time.monotonic(), busy, steal, tree_cpu_s(self.pid)

    def _sample(self, prev: tuple, cur: tuple) -> dict | None:
        dt = cur[0] - prev[0]
        if dt <= 0:
            return None
        total, steal, ours = (cur[1] - prev[1]) / dt, (cur[2] - prev[2]) / dt, (cur[3] - prev[3]) / dt
        return {"t": cur[0] - self._t0, "total": total, "ours": ours, "other": max(0.0, total - ours), "steal": steal}

    def _run(self) -> None:
        self._prev = self._read()
        while not self._stop.wait(self.interval_s):
            cur = self._read()
            sample = self._sample(self._prev, cur)
            if sample is not None:
                self.samples.append(sample)
            self._prev = cur

    def summary(self) -> dict:
        """Medians, 90th percentiles and maxima of other / ours / steal (cores), and the share of quiet samples.
        While running, the part since the last sample counts too (a run shorter than one interval has one sample)."""
        if not self.available:
            return {"available": False}
        s = list(self.samples)
        prev = getattr(self, "_prev", None)
        if self._thread is not None and prev is not None and time.monotonic() - prev[0] >= 0.05:
            last = self._sample(prev, self._read())
            s += [last] if last is not None else []
        if not s:
            return {"available": True, "samples": 0}
        out: dict = {"available": True, "samples": len(s), "interval_s": self.interval_s, "cpus": os.cpu_count()}
        for key in ("other", "ours", "steal"):
            xs = sorted(x[key] for x in s)
            out[f"{key}_cores"] = {"median": statistics.median(xs), "p90": xs[min(len(xs) - 1, int(0.9 * len(xs)))],
                                   "max": xs[-1], "mean": statistics.fmean(xs)}
        out["quiet_share"] = sum(x["other"] < QUIET_OTHER_CORES and x["steal"] < QUIET_STEAL_CORES for x in s) / len(s)
        return out


QUIET_OTHER_CORES = 0.25  # "quiet": other processes use less than a quarter of a core ...
QUIET_STEAL_CORES = 0.05  # ... and the hypervisor takes less than 5% of a core (other tenants of the host)
ACTIVE: list[MachineMonitor] = []  # the monitors of the benchmarks running in this process, innermost last


def active_summary() -> dict | None:
    """The summary of the innermost running benchmark's monitor (what Result records), or None."""
    return ACTIVE[-1].summary() if ACTIVE else None


def describe(summary: dict) -> str:
    """One line for a result's markdown header."""
    if not summary.get("available"):
        return "machine monitor: not available (no /proc)"
    if not summary.get("samples"):
        return "machine monitor: no samples (run shorter than one interval)"
    o, st = summary["other_cores"], summary["steal_cores"]
    return (f"other processes {o['median']:.2f} cores median (p90 {o['p90']:.2f}, max {o['max']:.2f}), "
            f"steal {st['mean']:.2f} cores, quiet {100 * summary['quiet_share']:.0f}% of the time")


def wait_for_quiet(max_other_cores: float = QUIET_OTHER_CORES, window_s: float = 10.0, timeout_s: float = 600.0,
                   interval_s: float = 0.5, on_wait=None, max_steal_cores: float = QUIET_STEAL_CORES) -> dict:
    """Block until, in every sample of the last ``window_s``, other processes used less than ``max_other_cores``
    and steal was below ``max_steal_cores``, or ``timeout_s`` passed.
    -> {quiet, waited_s, last_other_cores, last_steal_cores}; ``on_wait(status)`` is called every window."""
    if not proc_available():
        return {"quiet": None, "waited_s": 0.0, "reason": "no /proc"}
    t0, need = time.monotonic(), max(1, round(window_s / interval_s))
    run, other, steal, told, seen = 0, 0.0, 0.0, t0, 0
    with MachineMonitor(interval_s) as mon:
        while True:
            time.sleep(interval_s)
            new, seen = mon.samples[seen:], len(mon.samples)
            for sample in new:
                other, steal = sample["other"], sample["steal"]
                run = run + 1 if other < max_other_cores and steal < max_steal_cores else 0
            waited = time.monotonic() - t0
            status = {"waited_s": waited, "last_other_cores": other, "last_steal_cores": steal}
            if run >= need:
                return {"quiet": True, **status}
            if waited >= timeout_s:
                return {"quiet": False, **status}
            if on_wait is not None and time.monotonic() - told >= window_s:
                on_wait(status)
                told = time.monotonic()

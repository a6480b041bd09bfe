"""Benchmarks in the background: detached from the terminal, one at a time, on a quiet machine.

    python -m bench bg start [gate options] -- grpo-trl --steps 40    # returns at once; prints the run id
    python -m bench bg status [--json]                                # every run: state, gate, rc, log tail
    python -m bench bg wait [--id ID] [--timeout S]                   # block until it ends; exit with its rc
    python -m bench bg stop [--id ID]                                 # end it (its whole process group)

A background run is a detached process (its own session: closing the terminal or the agent that
started it does not end it) that
  1. takes the bench lock: every ``python -m bench`` run holds it, foreground or background, so two
     benchmarks never share the CPUs (runs started together queue in order);
  2. waits until the machine is quiet: other processes below ``--max-other-cores`` and the hypervisor's
     steal below ``--max-steal-cores`` for ``--quiet-window`` seconds (bench/monitor.py), at most
     ``--quiet-timeout``; then it runs anyway
     and its result says how busy the machine was, or with ``--require-quiet`` it gives up (rc 3);
  3. runs the benchmark in a child ``python -m bench ...`` (a fresh process, as in the foreground)
     with its output in the run's log, and records the exit status.

State lives in ``bench/.tmp/bg`` (``MILES_BENCH_STATE_DIR``): ``runs/<id>.json`` (the state, rewritten
atomically at each phase), ``runs/<id>.log`` and ``lock``. Results land where a foreground run puts
them (bench/results, or ``MILES_BENCH_RESULTS``).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .common import ROOT, TMP

TERMINAL = ("done", "failed", "gave-up", "stopped")
START_GRACE_S = 60.0  # a run still "starting" (its process has not written its pid yet) is not called died before this
LOCK_HELD_ENV = "MILES_BENCH_LOCK_HELD"  # set for the benchmark child of a background run: its parent holds the lock


def state_dir() -> Path:
    return Path(os.environ.get("MILES_BENCH_STATE_DIR") or TMP / "bg")


def _runs() -> Path:
    d = state_dir() / "runs"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def read_state(run_id: str) -> dict:
    return json.loads((_runs() / f"{run_id}.json").read_text())


def _write_state(state: dict) -> None:
    path = _runs() / f"{state['id']}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, path)  # a reader never sees half a state file


def _update(state: dict, /, **changes) -> dict:
    state.update(changes)
    _write_state(state)
    return state


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) is not running
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def all_states() -> list[dict]:
    """Every run's state, oldest first; a run whose process died without a final state reads as ``died``."""
    out = []
    for path in sorted(_runs().glob("*.json")):
        try:
            s = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        starting = s.get("state") == "starting" and time.time() - path.stat().st_mtime < START_GRACE_S
        if s.get("state") not in TERMINAL and not starting and not _alive(s.get("pid")):
            s["state"] = "died"
        out.append(s)
    return out


# ---- the lock -----------------------------------------------------------------------------------
@contextlib.contextmanager
def bench_lock(argv: list[str], announce=print):
    """Hold the bench lock for the duration (an flock: released by the kernel if the holder dies). If another
    run holds it, say who and wait. A no-op in the benchmark child of a background run (its parent holds it)."""
    if os.environ.get(LOCK_HELD_ENV) == "1":
        yield
        return
    path = state_dir() / "lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            announce(f"[bench] another benchmark holds the lock ({f.read().strip() or 'unknown'}); waiting for it to end", flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0), f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "argv": argv, "since": _now()}))
        f.flush()
        os.environ[LOCK_HELD_ENV] = "1"  # nested runs in this process (`all`) and its children do not wait on themselves
        try:
            yield
        finally:
            os.environ.pop(LOCK_HELD_ENV, None)
            f.seek(0), f.truncate()
            fcntl.flock(f, fcntl.LOCK_UN)


# ---- start / run / status / wait / stop ---------------------------------------------------------------
def start(argv: list[str], max_other_cores: float, quiet_window: float, quiet_timeout: float, require_quiet: bool,
          max_steal_cores: float = 0.05) -> dict:
    """Launch a detached background run of ``python -m bench <argv>``; -> its state (id, pid, log)."""
    if not argv:
        raise SystemExit("python -m bench bg start: name the benchmark after `--`, e.g. `-- grpo-trl --steps 40`")
    from . import __main__ as cli

    cli.parser().parse_args(argv)  # a bad command fails here, in the foreground, not in a detached log
    run_id = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + f"-{os.getpid()}"
    log = _runs() / f"{run_id}.log"
    state = {"id": run_id, "argv": argv, "state": "starting", "created_at": _now(), "log": str(log), "pid": None,
             "gate": {"max_other_cores": max_other_cores, "max_steal_cores": max_steal_cores, "window_s": quiet_window, "timeout_s": quiet_timeout,
                      "require_quiet": require_quiet}}
    _write_state(state)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "bench", "bg", "_run", run_id], cwd=ROOT, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    # from here on only the child writes the state file (its first write records its pid); if it dies before
    # that, the run reads as died once START_GRACE_S have passed (all_states)
    return {**state, "pid": proc.pid}


def run(run_id: str) -> int:
    """The detached process: lock, quiet gate, the benchmark in a child process, the final state. -> its rc."""
    from .monitor import wait_for_quiet

    state = _update(read_state(run_id), pid=os.getpid(), state="waiting-for-lock")
    gate = state["gate"]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `stop`: finally-blocks run, the lock is released
    try:
        with bench_lock(["bg", run_id, *state["argv"]], announce=print):
            _update(state, state="waiting-for-quiet", lock_at=_now())
            quiet = wait_for_quiet(gate["max_other_cores"], gate["window_s"], gate["timeout_s"],
                                   on_wait=lambda w: _update(state, waiting=w), max_steal_cores=gate["max_steal_cores"])
            _update(state, quiet=quiet)
            print(f"[bench] quiet gate: {quiet}", flush=True)
            if quiet["quiet"] is False and gate["require_quiet"]:
                _update(state, state="gave-up", rc=3, finished_at=_now())
                return 3
            _update(state, state="running", started_at=_now())
            rc = subprocess.call([sys.executable, "-m", "bench", *state["argv"]], cwd=ROOT)  # inherits LOCK_HELD_ENV
            _update(state, state="done" if rc == 0 else "failed", rc=rc, finished_at=_now())
            return rc
    except SystemExit as e:  # SIGTERM from `stop`
        _update(state, state="stopped", rc=e.code, finished_at=_now())
        raise


def stop(run_id: str) -> dict:
    state = read_state(run_id)
    if state.get("state") in TERMINAL:
        return state
    pid = state.get("pid")
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)  # the run and its benchmark child (same session and group)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    state = read_state(run_id)
    if state.get("state") not in TERMINAL:  # it died before it could write its final state
        state = _update(state, state="stopped", finished_at=_now())
    return state


def wait(run_id: str, timeout_s: float | None = None, poll_s: float = 0.5) -> dict:
    t0 = time.monotonic()
    while True:
        state = next((s for s in all_states() if s["id"] == run_id), None)
        if state is None:
            raise SystemExit(f"no background run {run_id!r} in {_runs()}")
        if state["state"] in (*TERMINAL, "died"):
            return state
        if timeout_s is not None and time.monotonic() - t0 > timeout_s:
            return state
        time.sleep(poll_s)


def _latest_id() -> str:
    states = all_states()
    if not states:
        raise SystemExit(f"no background runs in {_runs()}")
    return states[-1]["id"]


def _tail(path: str, n: int = 5) -> list[str]:
    try:
        return Path(path).read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def _line(s: dict) -> str:
    gate = s.get("quiet") or s.get("waiting") or {}
    other, steal = gate.get("last_other_cores"), gate.get("last_steal_cores")
    bits = [s["id"], s["state"], "python -m bench " + " ".join(s["argv"])]
    if other is not None:
        bits.append(f"other processes {other:.2f} cores")
    if steal is not None:
        bits.append(f"steal {steal:.2f} cores")
    if "rc" in s:
        bits.append(f"rc {s['rc']}")
    return "  ".join(bits)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench bg", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("start", help="start a benchmark in the background: python -m bench bg start -- grpo-trl --steps 40")
    st.add_argument("--max-other-cores", type=float, default=0.25, help="quiet: other processes use less CPU than this (cores)")
    st.add_argument("--max-steal-cores", type=float, default=0.05,
                    help="quiet: the hypervisor steals less than this (cores; other tenants of the host)")
    st.add_argument("--quiet-window", type=float, default=10.0, help="seconds the machine must stay quiet before the run")
    st.add_argument("--quiet-timeout", type=float, default=900.0, help="wait at most this long for quiet")
    st.add_argument("--require-quiet", action="store_true", help="give up (rc 3) instead of running on a busy machine")
    st.add_argument("bench_argv", nargs=argparse.REMAINDER, help="after --: the benchmark and its options")
    s = sub.add_parser("status", help="every background run: state, quiet gate, rc; the latest run's log tail")
    s.add_argument("--json", action="store_true")
    w = sub.add_parser("wait", help="block until a run ends; exit with its rc")
    w.add_argument("--id", default=None, help="default: the latest run")
    w.add_argument("--timeout", type=float, default=None)
    k = sub.add_parser("stop", help="stop a run (default: the latest)")
    k.add_argument("--id", default=None)
    r = sub.add_parser("_run", help=argparse.SUPPRESS)
    r.add_argument("run_id")
    a = p.parse_args(argv)
    if a.cmd == "start":
        bench_argv = a.bench_argv[1:] if a.bench_argv[:1] == ["--"] else a.bench_argv
        state = start(bench_argv, a.max_other_cores, a.quiet_window, a.quiet_timeout, a.require_quiet, a.max_steal_cores)
        print(f"started {state['id']} (pid {state['pid']}): python -m bench {' '.join(bench_argv)}\n"
              f"  log: {state['log']}\n  python -m bench bg status | wait | stop")
        return 0
    if a.cmd == "status":
        states = all_states()
        if a.json:
            print(json.dumps(states, indent=2))
            return 0
        if not states:
            print(f"no background runs in {_runs()}")
        for s in states:
            print(_line(s))
        if states:
            print(f"\nlog of {states[-1]['id']} ({states[-1]['log']}):")
            print("\n".join("  " + line for line in _tail(states[-1]["log"])))
        return 0
    if a.cmd == "wait":
        state = wait(a.id or _latest_id(), a.timeout)
        print(_line(state))
        if state["state"] not in (*TERMINAL, "died"):
            return 124
        return int(state.get("rc") or 0) if state["state"] != "died" else 1
    if a.cmd == "stop":
        print(_line(stop(a.id or _latest_id())))
        return 0
    return run(a.run_id)

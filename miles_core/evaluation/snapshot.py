"""Snapshot eval: at an eval point the live policy is exported as an HF snapshot and evaluated in a
background thread on its own engine, while training continues (``eval_mode: snapshot``).

    submit(step)     between rollouts, on the flow's thread: capacity check -> export -> start the eval
                     -> None, or a skip result at once: busy (eval_max_in_flight running, policy skip)
                     or export_failed. Policy backpressure waits for a running eval to finish instead.
    collect(wait)    results of the evals that finished (all of them with wait=True), in step order;
                     then retention: only the newest ``eval_keep_snapshots`` finished snapshots stay.
    close()          wait for running evals, stop the threads.

Snapshots live in ``<root>/<step>/`` (step = weight version), ``.complete`` written last; an eval
whose snapshot is incomplete when it starts is skipped as ckpt_missing (run_point).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Literal

from .point import EvalPoint, EvalSuite, LoadEngine, PointResult, run_point


class SnapshotEvaluator:
    def __init__(self, suite: EvalSuite, root: Path, export_live: Callable[[Path, int], Path], load_engine: LoadEngine,
                 max_in_flight: int = 2, policy: Literal["backpressure", "skip"] = "backpressure", keep: int | None = None,
                 version_now: Callable[[], int] | None = None):
        self.suite, self.root, self.export_live, self.load_engine = suite, Path(root), export_live, load_engine
        self.version_now = version_now  # the trainer's weight version, read when an eval finishes (eval/lag_steps)
        self.max_in_flight, self.policy, self.keep = max_in_flight, policy, keep
        self._pool = ThreadPoolExecutor(max_in_flight, thread_name_prefix="miles-snapshot-eval")
        self._running: dict[int, tuple[Future, float]] = {}  # step -> (eval, export seconds)
        self._finished: list[PointResult] = []

    @property
    def in_flight(self) -> int:
        return sum(not f.done() for f, _ in self._running.values())

    def submit(self, step: int, rollout_id: int | None = None) -> PointResult | None:
        """Export the live weights as weight version ``step`` (trained through ``rollout_id``) and start their eval."""
        while self.in_flight >= self.max_in_flight:
            if self.policy == "skip":
                return PointResult.skip(step, "busy", f"{self.in_flight} evals in flight (eval_max_in_flight {self.max_in_flight})")
            wait([f for f, _ in self._running.values()], return_when=FIRST_COMPLETED)
        t0 = time.perf_counter()
        try:
            path = self.export_live(self.root, step)
        except Exception as e:
            return PointResult.skip(step, "export_failed", f"{type(e).__name__}: {e}")
        seconds = time.perf_counter() - t0
        self._running[step] = (self._pool.submit(self._run, EvalPoint(step, Path(path), rollout_id=rollout_id)), seconds)
        return None

    def _run(self, point: EvalPoint) -> PointResult:
        result = run_point(point, self.suite, self.load_engine)
        if self.version_now is not None and not result.skipped:
            result.metrics["eval/lag_steps"] = float(self.version_now() - point.step)
        return result

    def collect(self, wait_all: bool = False) -> list[PointResult]:
        if wait_all:
            wait([f for f, _ in self._running.values()])
        done = sorted(s for s, (f, _) in self._running.items() if f.done())
        results = []
        for step in done:
            future, seconds = self._running.pop(step)
            result = future.result()  # run_point turns every failure into a skip result
            result.metrics["eval/export_time_seconds"] = seconds
            results.append(result)
        self._retain()
        return results

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _retain(self) -> None:
        if self.keep is None or not self.root.is_dir():
            return
        steps = sorted(int(p.name) for p in self.root.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) not in self._running)
        for step in steps[: max(0, len(steps) - self.keep)]:
            path = self.root / str(step)
            (path / ".complete").unlink(missing_ok=True)  # readers stop trusting it first
            shutil.rmtree(path, ignore_errors=True)

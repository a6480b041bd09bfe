"""Readable log lines of a run, from the rows the fan-out logs: one INFO line per rollout (reward,
response length, truncation, wall time since the previous rollout), one per eval point (reward per
dataset, or the skip reason), and the run's end (finished, or failed with how to resume).

The lines go to the ``miles.run`` logger; the flows attach Prefect's API handler to it (flows/runlog.py),
so they are the flow run's logs in the Prefect UI. Checkpoint and export lines come from their tasks.
"""

from __future__ import annotations

import logging
import time

from .plots import datasets

RUN_LOG = "miles.run"
log = logging.getLogger(RUN_LOG)


class RunLogMirror:
    name = "log"
    link = ""  # the flow run's logs: nothing to tag the MLflow run with

    def __init__(self, num_rollout: int | None):
        self.num_rollout = num_rollout
        self.marks: dict[str, int] = {}
        self._last = time.monotonic()  # the previous rollout line (or the open)
        self._rollouts: list[tuple[int, float]] = []  # (rollout id, raw reward) logged by this process

    @classmethod
    def open(cls, spec) -> "RunLogMirror":
        return cls(spec.params.get("derived", {}).get("num_rollout"))

    def log(self, metrics: dict[str, float], axis: str, step: int) -> None:
        if axis == "rollout/step":
            self._rollout(metrics, step)
        elif axis == "eval/step":
            self._eval(metrics, step)

    def log_extra(self, metrics: dict[str, float], axis: str, step: int) -> None:
        skipped = [k.removeprefix("eval/skipped_") for k in metrics if k.startswith("eval/skipped_")]
        if axis == "eval/step" and skipped:
            log.info("eval at eval/step %d skipped: %s", step, ", ".join(skipped))

    def _rollout(self, m: dict[str, float], step: int) -> None:
        now = time.monotonic()
        wall, self._last = now - self._last, now
        of = f" ({step + 1}/{self.num_rollout})" if self.num_rollout else ""
        reward = m.get("rollout/raw_reward", float("nan"))
        self._rollouts.append((step, reward))
        log.info("rollout %d%s: reward %.4f, response length %.1f tokens, truncated %.2f, step time %.2f s", step, of, reward,
                 m.get("rollout/response_len/mean", float("nan")), m.get("rollout/truncated_ratio", float("nan")), wall)

    def _eval(self, m: dict[str, float], step: int) -> None:
        scores = ", ".join(f"{ds} {m[f'eval/{ds}']:.4f}" for ds in datasets(m) if f"eval/{ds}" in m)
        log.info("eval at eval/step %d: %s", step, scores or "no dataset scored")

    def flush(self) -> None:
        """Log lines are shipped by their handler."""

    def close(self, status: str) -> None:
        last = self._rollouts[-1][0] if self._rollouts else None
        if status == "FINISHED":
            first = self._rollouts[0][1] if self._rollouts else float("nan")
            log.info("run finished: %d rollouts in this run (last rollout %s), reward %.4f -> %.4f", len(self._rollouts), last,
                     first, self._rollouts[-1][1] if self._rollouts else float("nan"))
        else:
            log.error("run failed after rollout %s: rerun the same command (or retry this flow run) to resume from its last "
                      "checkpoint; steps already logged are not logged again", last if last is not None else "(none)")

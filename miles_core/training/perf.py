"""Trainer timings and throughput, with the reference system's perf/* names.

Phases timed by the trainer (seconds): log_probs (old policy), ref_log_probs, teacher_log_probs, and train
(the whole train_rollout). Derived, as the reference:

    train_wait_time = time between the end of the previous train and the start of this one (0 at the first)
    step_time       = train_wait_time + train_time;        wait_time_ratio = train_wait_time / step_time
    fwd FLOPs       = 2 * n_params * tokens                (dense approximation; attention FLOPs not counted)
    log_probs_tflops = fwd FLOPs / log_probs_time / 1e12   (likewise ref_log_probs_tflops)
    actor_train_tflops = 3 * fwd FLOPs * num_steps_per_rollout / actor_train_time / 1e12
    actor_train_mfu = actor_train_tflops / mfu_peak_tflops (only when mfu_peak_tflops is set)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class PhaseTimer:
    """Seconds per named phase of one rollout, and the gap since the previous rollout's train ended."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last_train_end: float | None = None

    @contextlib.contextmanager
    def phase(self, name: str, when: bool = True) -> Iterator[None]:
        """Time the block as phase ``name`` (not timed, nor reported, when ``when`` is false)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if when:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def start_rollout(self) -> float:
        """Clear the phases; -> the train wait (0 for the first rollout)."""
        self.seconds = {}
        now = time.perf_counter()
        return 0.0 if self._last_train_end is None else now - self._last_train_end

    def end_rollout(self) -> None:
        self._last_train_end = time.perf_counter()


def perf_metrics(timer: PhaseTimer, *, train_wait: float, train_time: float, n_params: int, tokens: float,
                 num_steps: int, peak_tflops: float | None) -> dict[str, float]:
    """The perf/* timings and throughputs of one rollout (module docstring)."""
    fwd_tflop = 2.0 * n_params * tokens / 1e12
    step = train_wait + train_time
    m = {"perf/train_time": train_time, "perf/train_wait_time": train_wait, "perf/step_time": step,
         "perf/wait_time_ratio": train_wait / step if step > 0 else 0.0,
         "perf/actor_train_tflops": 3.0 * fwd_tflop * num_steps / max(train_time, 1e-9)}
    if "log_probs" in timer.seconds:
        m["perf/log_probs_time"] = timer.seconds["log_probs"]
        m["perf/log_probs_tflops"] = fwd_tflop / max(timer.seconds["log_probs"], 1e-9)
    if "ref_log_probs" in timer.seconds:
        m["perf/ref_log_probs_time"] = timer.seconds["ref_log_probs"]
        m["perf/ref_log_probs_tflops"] = fwd_tflop / max(timer.seconds["ref_log_probs"], 1e-9)
    if "teacher_log_probs" in timer.seconds:
        m["perf/teacher_log_probs_time"] = timer.seconds["teacher_log_probs"]
    if peak_tflops:
        m["perf/mfu_peak_tflops"] = peak_tflops
        m["perf/actor_train_mfu"] = m["perf/actor_train_tflops"] / peak_tflops
    return m

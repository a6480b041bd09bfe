"""Eval points that do not run are recorded, never silently dropped: ``eval/skipped_<reason> = 1``
at the point's eval/step (REFERENCE §5).

Built-in reasons, each raised by one condition:

    busy            eval_max_in_flight evals are running and eval_overflow_policy is skip
    export_failed   writing the HF snapshot to evaluate raised (disk, permissions, a bad checkpoint)
    ckpt_missing    the snapshot or checkpoint is not complete (no valid .complete) when its eval starts
    crashed         the eval itself raised (engine load, generation, reward, a custom eval function)
    unhealthy       an eval engine (or the router) reports not healthy / cannot be reached
    pin_violation   the engines do not all report the expected weight version, before or after the eval,
                    or the samples carry another version

A custom eval function (``eval_function_path``) raises ``EvalSkip("reason")`` for its own reasons.
"""

from __future__ import annotations

import re

BUILTIN_REASONS = ("busy", "export_failed", "ckpt_missing", "crashed", "unhealthy", "pin_violation")
_REASON = re.compile(r"^[a-z0-9_]{1,64}$")


class EvalSkip(Exception):
    """Raise from an eval function to skip the point; ``reason`` becomes ``eval/skipped_<reason>``."""

    def __init__(self, reason: str, detail: str = ""):
        if not _REASON.match(reason):
            raise ValueError(f"EvalSkip reason {reason!r}: use 1-64 characters of [a-z0-9_] (it becomes a metric key)")
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


def skip_key(reason: str) -> str:
    return f"eval/skipped_{reason}"


def skipped_reason(metrics: dict[str, float]) -> str | None:
    """The reason of a skip-metrics dict, or None for an eval that ran."""
    return next((k.removeprefix("eval/skipped_") for k in metrics if k.startswith("eval/skipped_")), None)

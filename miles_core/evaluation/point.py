"""One eval point: the weights of one weight version, evaluated on an engine, with every way it can
fail turned into a skip reason (skip.py) instead of an exception.

    run_point(point, suite, load_engine, export)     a snapshot or checkpoint dir on disk
        complete? (ckpt_missing) -> [checkpoint: export to HF (export_failed)] -> load an engine (crashed)
        -> run_on_engine
    run_on_engine(engine, suite, step)               an engine already serving the weights
        health (unhealthy) -> version == step (pin_violation) -> eval fn (EvalSkip, crashed)
        -> every generated sample and the engine still at step (pin_violation)

eval/step is the weight version the evaluated weights were synced as (docs/decisions.md): the
checkpoint of rollout i holds meta weight_version v (saved before the sync that follows it) and
its weights are evaluated as version v + 1 = i + 2.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from miles_core.rewards import RewardOptions

from .core import EvalDataset, evaluate
from .skip import EvalSkip, skip_key

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalPoint:
    """Weights to evaluate: an HF snapshot dir or a checkpoint dir, at ``step`` (its weight version)."""

    step: int
    path: Path
    kind: Literal["snapshot", "checkpoint"] = "snapshot"
    rollout_id: int | None = None


@dataclass
class PointResult:
    """Metrics (without the axis) and sample rows of a point; ``reason`` set when it was skipped."""

    step: int
    metrics: dict[str, float]
    rows: list[dict] = field(default_factory=list)
    reason: str | None = None
    detail: str = ""

    @classmethod
    def skip(cls, step: int, reason: str, detail: str = "", **extra: float) -> "PointResult":
        if reason != "busy":
            logger.warning("eval at step %d skipped: %s %s", step, reason, detail)
        return cls(step, {skip_key(reason): 1.0, **extra}, [], reason, detail)

    @property
    def skipped(self) -> bool:
        return self.reason is not None


@dataclass(frozen=True)
class EvalSuite:
    """Everything an eval needs except the engine: datasets, reward settings, seed, detokenizer and
    the eval function (``eval_function_path``; None = ``default_eval``)."""

    datasets: tuple[EvalDataset, ...]
    reward: RewardOptions
    reward_key: str | None
    seed: int
    decode: Callable[[list[int]], str]
    eval_fn: Callable[["EvalRequest"], tuple[dict[str, float], list[dict]]] | None = None
    eval_log: Callable[[int, dict, dict | None], bool] | None = None  # custom_eval_rollout_log_function_path, args bound


@dataclass(frozen=True)
class EvalRequest:
    """The argument of an eval function: ``fn(request) -> (metrics, rows)``; it may raise EvalSkip."""

    engine: Any
    datasets: tuple[EvalDataset, ...]
    reward: RewardOptions
    reward_key: str | None
    seed: int
    decode: Callable[[list[int]], str]
    step: int
    log: Callable[[dict], bool] | None = None  # the default eval hands its per-dataset data to it (True: no metrics)


def default_eval(req: EvalRequest) -> tuple[dict[str, float], list[dict]]:
    return evaluate(req.engine, list(req.datasets), req.reward, req.reward_key, req.seed, req.decode, req.log)


class _VersionWatch:
    """An engine proxy that records the weight version of every generated result."""

    def __init__(self, engine):
        self._engine, self.versions = engine, set()

    def generate(self, requests, seed):
        results = self._engine.generate(requests, seed=seed)
        self.versions.update(r.weight_version for r in results)
        return results

    def __getattr__(self, name):
        return getattr(self._engine, name)


def run_on_engine(engine, suite: EvalSuite, step: int, rollout_id: int | None = None) -> PointResult:
    """Evaluate the weights ``engine`` serves, pinned to weight version ``step``; ``rollout_id`` (the last rollout
    trained) is what suite.eval_log is called with (0 when None, the reference's id before training)."""
    t0 = time.perf_counter()
    try:
        healthy, version = engine.health(), engine.get_weight_version()
    except Exception as e:  # an engine that cannot answer is not healthy
        return PointResult.skip(step, "unhealthy", f"{type(e).__name__}: {e}")
    if not healthy:
        return PointResult.skip(step, "unhealthy", f"{engine!r} reports not healthy")
    if version != step:
        return PointResult.skip(step, "pin_violation", f"engine reports weight version {version}, expected {step}")
    watch = _VersionWatch(engine)
    log = None if suite.eval_log is None else (lambda data: suite.eval_log(rollout_id or 0, data, None))
    req = EvalRequest(watch, suite.datasets, suite.reward, suite.reward_key, suite.seed, suite.decode, step, log)
    try:
        metrics, rows = (suite.eval_fn or default_eval)(req)
        after = engine.get_weight_version()
    except EvalSkip as e:
        return PointResult.skip(step, e.reason, e.detail)
    except Exception as e:
        logger.exception("eval at step %d crashed", step)
        return PointResult.skip(step, "crashed", f"{type(e).__name__}: {e}")
    if watch.versions - {step} or after != step:
        return PointResult.skip(step, "pin_violation", f"samples at versions {sorted(watch.versions)}, engine at {after}, expected {step}")
    return PointResult(step, {**metrics, "eval/duration_seconds": time.perf_counter() - t0}, rows)


LoadEngine = Callable[[Path, int], Any]  # (HF snapshot dir, weight version) -> an engine serving it at that version
Export = Callable[[EvalPoint], Path]  # checkpoint point -> a complete HF snapshot dir


def run_point(point: EvalPoint, suite: EvalSuite, load_engine: LoadEngine, export: Export | None = None) -> PointResult:
    """Evaluate a snapshot or checkpoint on disk; every failure becomes a skip reason."""
    from miles_core.checkpoint import is_complete_export
    from miles_core.checkpoint.layout import checkpoint_problem

    problem = checkpoint_problem(point.path) if point.kind == "checkpoint" else (
        None if is_complete_export(point.path) else f"{point.path} has no valid .complete")
    if problem:
        return PointResult.skip(point.step, "ckpt_missing", str(problem))
    extra: dict[str, float] = {}
    snapshot = point.path
    if point.kind == "checkpoint":
        t0 = time.perf_counter()
        try:
            snapshot = export(point)
        except Exception as e:
            logger.exception("export of %s failed", point.path)
            return PointResult.skip(point.step, "export_failed", f"{type(e).__name__}: {e}")
        extra["eval/export_time_seconds"] = time.perf_counter() - t0
    try:
        engine = load_engine(snapshot, point.step)
    except Exception as e:
        logger.exception("loading an eval engine from %s failed", snapshot)
        return PointResult.skip(point.step, "crashed", f"engine load: {type(e).__name__}: {e}", **extra)
    result = run_on_engine(engine, suite, point.step, point.rollout_id)
    result.metrics.update(extra)
    return result


def load_hf_engine(snapshot: Path, version: int, dtype: str = "float32", device: str = "cpu"):
    """An in-process HF engine on a snapshot, reporting ``version``, on ``device`` (cpu | cuda | auto: miles_core/device.py)."""
    from miles_core.rollout.hf_engine import HFEngine

    engine = HFEngine.from_pretrained(snapshot, dtype, device)
    engine.set_weight_version(version)
    return engine

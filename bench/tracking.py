"""MLflow logging cost per rollout, on a local SQLite store under bench/.tmp.

What one rollout of the train flow logs: the optimizer-step metrics at ``train/step`` (one dict per
step) and the rollout metrics at ``rollout/step`` (one dict), both through ``RunTracker.log`` ->
``MlflowTracker.log_metrics`` (one synchronous ``log_batch`` each). The metric dicts are real: taken
from one tiny-recipe rollout (generate + train) before timing.

Variants, each timed over ``rollouts`` simulated rollouts, ``repeats`` times, interleaved:
  tracker           MlflowTracker.log_metrics, synchronous (the tracker's default: the eval flow, tests)
  tracker_async     MlflowTracker(asynchronous=True) as the train flow uses it: log_metrics twice per rollout,
                    flushed once at the end (flush counted; the flow also flushes before each checkpoint)
  one_batch_sync    both dicts in a single log_batch per rollout
  client_async      MlflowClient.log_batch(synchronous=False), flushed once at the end (flush counted)
  samples_table     MlflowTracker.log_table of 8 sample rows (what ``log_samples`` adds at each eval point)
Cost per rollout = median run time / rollouts; its share of a tiny-recipe step uses the step time
measured here (one plain-loop rollout of the tiny recipe, median of a few).
"""

from __future__ import annotations

import shutil
import statistics
import time

from .common import TMP, Result, summarize, table


def real_metrics(steps: int = 4) -> tuple[dict, dict, float]:
    """(train-step metrics, rollout metrics, median seconds of a tiny-recipe rollout) from real rollouts."""
    from flows.recipes import load_config
    from miles_core.runtime.placement import build_runtime

    run_dir = TMP / "tracking" / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    rt = build_runtime(load_config("tiny", {"run_dir": str(run_dir), "eval_prompt_data": None}))
    rt.sync_weights()
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        metrics = rt.generate(i)
        out = rt.train(i)
        rollout_metrics, train_steps = out.rollout, out.steps
        metrics |= rollout_metrics | rt.sync_weights()
        times.append(time.perf_counter() - t0)
    return train_steps[0], metrics, statistics.median(times[1:])


def _store(tag: str, asynchronous: bool = False):
    from miles_core.tracking import MlflowTracker

    d = TMP / "tracking" / tag
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return MlflowTracker(f"sqlite:///{d / 'mlflow.db'}", "bench", tag, artifact_location=(d / "mlruns").as_uri(),
                         asynchronous=asynchronous)


def _tracker(tracker, step_m: dict, roll_m: dict, n: int) -> float:
    """-> seconds the calls blocked the caller (before the final flush)."""
    t0 = time.perf_counter()
    for i in range(n):
        tracker.log_metrics({**step_m, "train/step": i}, step=i)
        tracker.log_metrics({**roll_m, "rollout/step": i}, step=i)
    blocked = time.perf_counter() - t0
    tracker.flush()  # an asynchronous tracker: its flush is part of the cost
    return blocked


def _metrics(d: dict, step: int):
    from mlflow.entities import Metric

    from miles_core.tracking import sanitize_key

    now = int(time.time() * 1000)
    return [Metric(sanitize_key(k), float(v), now, step) for k, v in d.items()]


def _one_batch_sync(tracker, step_m: dict, roll_m: dict, n: int) -> None:
    for i in range(n):
        items = _metrics({**step_m, "train/step": i}, i) + _metrics({**roll_m, "rollout/step": i}, i)
        tracker.client.log_batch(tracker.run_id, metrics=items, synchronous=True)


def _client_async(tracker, step_m: dict, roll_m: dict, n: int) -> None:
    pending = []
    for i in range(n):
        items = _metrics({**step_m, "train/step": i}, i) + _metrics({**roll_m, "rollout/step": i}, i)
        pending.append(tracker.client.log_batch(tracker.run_id, metrics=items, synchronous=False))
    for op in pending:  # the flush at the end of the run, counted
        op.wait()


def _samples_table(tracker, step_m: dict, roll_m: dict, n: int) -> None:
    """What ``log_samples`` (default 8) adds per rollout: one MLflow table artifact of 8 sample rows."""
    rows = [{"rollout_id": 0, "group_index": g, "prompt": "3+4=", "response": "\\boxed{7}", "label": "7", "reward": 1.0,
             "status": "completed", "weight_version": 1} for g in range(8)]
    for i in range(n):
        tracker.log_table([{**r, "rollout_id": i} for r in rows], f"samples/rollout_{i:05d}.json")


VARIANTS = {"tracker": _tracker, "tracker_async": _tracker, "one_batch_sync": _one_batch_sync, "client_async": _client_async,
            "samples_table": _samples_table}


def bench(rollouts: int, repeats: int) -> Result:
    step_m, roll_m, step_s = real_metrics()
    times: dict[str, list[float]] = {k: [] for k in VARIANTS}
    blocked: dict[str, list[float]] = {"tracker": [], "tracker_async": []}
    for r in range(repeats):
        names = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
        for name in names:
            tracker = _store(f"{name}-{r}", asynchronous=name == "tracker_async")
            t0 = time.perf_counter()
            calls_s = VARIANTS[name](tracker, step_m, roll_m, rollouts)
            times[name].append(time.perf_counter() - t0)
            if name in blocked:
                blocked[name].append(calls_s)
            if name != "samples_table":
                logged = len(tracker.metric_history("rollout/step"))
                assert logged == rollouts, f"{name}: {logged} rollout/step points, expected {rollouts}"
    per = {k: summarize([t / rollouts * 1000 for t in v]) for k, v in times.items()}
    per_blocked = {k: summarize([t / rollouts * 1000 for t in v]) for k, v in blocked.items()}
    res = Result("tracking", {"rollouts": rollouts, "repeats": repeats, "store": "sqlite (local file)",
                              "metrics_per_rollout": len(step_m) + len(roll_m) + 2, "tiny_step_s": step_s})
    res.figures = {"ms_per_rollout": per, "ms_per_rollout_blocking_the_loop": per_blocked}
    res.ratios = {f"{k}/pct_of_tiny_step": per[k]["median"] / 1000 / step_s * 100 for k in per}
    res.ratios |= {f"{k}/blocking_pct_of_tiny_step": per_blocked[k]["median"] / 1000 / step_s * 100 for k in per_blocked}
    res.noise = {k: per[k]["rel_iqr"] for k in per}
    res.tables.append(table(
        ["variant", "ms per rollout (IQR)", "% of a tiny-recipe step", "of which the caller waits (ms)"],
        [[k, f"{per[k]['median']:.1f} ({per[k]['p25']:.1f}-{per[k]['p75']:.1f})", f"{res.ratios[f'{k}/pct_of_tiny_step']:.1f}%",
          f"{per_blocked[k]['median']:.1f} ({per_blocked[k]['p25']:.1f}-{per_blocked[k]['p75']:.1f})" if k in per_blocked else ""]
         for k in per]))
    res.notes += [
        f"{len(step_m) + len(roll_m) + 2} metric values per rollout (one train step + the rollout dict, real keys from a tiny rollout); "
        f"{rollouts} rollouts per timed run, {repeats} runs per variant, interleaved; tiny-recipe step measured here: {step_s:.3f} s.",
        "tracker_async is what the train flow does (MlflowTracker(asynchronous=True).log_metrics twice per rollout, "
        "flushed at the end); tracker is the same calls on the synchronous tracker (two synchronous log_batch calls).",
        "samples_table is logged at eval points only (log_samples_interval, default eval_interval), not every rollout.",
    ]
    return res

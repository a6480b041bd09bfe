"""Orchestration overhead: the tiny recipe through the Prefect train flow vs the same library calls in a
plain Python loop (no Prefect), alternating flow run / loop run in one process.

The loop is the flow's own body (``train.fn``) with every Prefect task it calls replaced by the task's
undecorated function, artifacts by no-ops and the run context by a fixed id (``without_prefect``): the
same library calls in the same order, MLflow included. So the difference is Prefect's: the flow run,
task runs and their state transitions through the API, result handling, artifacts.

Figures: wall time of a whole run (flow: from the call to its return; loop: from building the runtime
to the end), and the steady per-rollout time (median gap between consecutive rollout ends, from the
progress events both emit), whose difference is the per-rollout overhead at this step size. The first
flow run of the process also starts Prefect's ephemeral API; it is timed apart and not counted.

CPU time per run, apart: this process (``time.process_time``: training + Prefect's client engine) and
the ephemeral API server (a subprocess, from /proc; it competes with training for the same cores).
``overrides`` change the recipe (e.g. a larger step: ``rollout_batch_size=16``), so the fixed per-rollout
cost can be set against the step size.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from contextlib import contextmanager

from .common import TMP, Result, fmt_stat, summarize, table


PER_ROLLOUT_TASKS = ("generate", "train", "update-weights")  # async_mode off: each rollout's task runs (save, eval: when due)


def _config(tag: str, rollouts: int, overrides: dict | None = None):
    from flows.recipes import load_config

    run_dir = TMP / "orchestration" / tag
    shutil.rmtree(run_dir, ignore_errors=True)
    return load_config("tiny", {**(overrides or {}), "run_dir": str(run_dir), "num_rollout": rollouts})


def _server_cpu_s() -> float:
    """CPU seconds (user + system) of this process's descendants: the ephemeral Prefect API server, when it runs."""
    from .monitor import children, tree_cpu_s

    return sum(tree_cpu_s(pid) for pid in children(os.getpid()))


@contextmanager
def _cpu(out: dict):
    """Wall, this process's CPU and the API server's CPU spent inside the block -> out."""
    w0, c0, s0 = time.perf_counter(), time.process_time(), _server_cpu_s()
    yield
    out |= {"total_s": time.perf_counter() - w0, "client_cpu_s": time.process_time() - c0, "server_cpu_s": _server_cpu_s() - s0}


def _marks() -> tuple[list[float], callable]:
    from miles_core.tracking import progress

    marks: list[float] = []
    return marks, progress.subscribe(lambda i, n, m: marks.append(time.perf_counter()))


def run_flow(rollouts: int, tag: str, overrides: dict | None = None) -> dict:
    from flows.train import train

    cfg = _config(tag, rollouts, overrides)
    marks, unsubscribe = _marks()
    out: dict = {}
    runs: list[tuple[str, float, float]] = []
    try:
        with timed_tasks(runs), _cpu(out):
            summary = train(cfg)
    finally:
        unsubscribe()
    # Prefect's client-side time on the flow's thread per task run: the call minus its body (the task function)
    engine = [call - body for _, call, body in runs]
    return out | {"gaps_s": _gaps(marks), "last_reward": summary["last_reward"], "task_runs": len(runs),
                  "task_engine_s": engine, "task_names": [name for name, _, _ in runs], "task_body_s": [b for _, _, b in runs]}


class _TimedCall:
    """Stands in for a Task where the flow calls it: records (name, call s, body s); delegates the rest (submit, ...)."""

    def __init__(self, task, runs: list, body: list[float]):
        self.task, self.runs, self.body = task, runs, body

    def __call__(self, *args, **kwargs):
        t0, body0 = time.perf_counter(), self.body[0]
        try:
            return self.task(*args, **kwargs)
        finally:
            self.runs.append((self.task.name, time.perf_counter() - t0, self.body[0] - body0))

    def __getattr__(self, name):
        return getattr(self.task, name)


def _timed(fn, record):
    """``fn`` that passes its wall time to ``record`` after every call."""
    import functools

    @functools.wraps(fn)  # Prefect reads the task function's signature through __wrapped__
    def call(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            record(time.perf_counter() - t0)

    return call


@contextmanager
def timed_tasks(runs: list):
    """While inside: every task the train flow (flows.train, flows.evaluate) calls records (name, call wall s,
    body wall s) into ``runs``. The body is the task function (the same library call the plain loop makes);
    the rest of the call is Prefect's task engine on the flow's thread: task run and state objects, state
    change events, the result record, contexts. A direct figure, not a difference of two runs."""
    from prefect import Task

    import flows.evaluate
    import flows.train

    body = [0.0]  # total body time so far; a call's body = the growth of this during the call

    def add(dt: float) -> None:
        body[0] += dt

    saved_attrs, saved_fns = [], {}
    for mod in (flows.train, flows.evaluate):
        for name, obj in list(vars(mod).items()):
            if not isinstance(obj, Task):
                continue
            if id(obj) not in saved_fns:
                saved_fns[id(obj)] = (obj, obj.fn)
                obj.fn = _timed(obj.fn, add)
            saved_attrs.append((mod, name, obj))
            setattr(mod, name, _TimedCall(obj, runs, body))
    try:
        yield
    finally:
        for mod, name, obj in saved_attrs:
            setattr(mod, name, obj)
        for obj, fn in saved_fns.values():
            obj.fn = fn


@contextmanager
def without_prefect(runs: list | None = None):
    """The train flow's own body as plain Python: in flows.train and flows.evaluate every Prefect task or
    flow is replaced by its undecorated function, the run context by a fixed flow-run id, artifacts by
    no-ops and the run logger by a standard logger. Everything else (library calls, MLflow) is unchanged,
    so the loop follows the flow as it evolves."""
    import logging
    import uuid
    from types import SimpleNamespace

    from prefect import Flow, Task

    import flows.evaluate
    import flows.train

    context = SimpleNamespace(flow_run=SimpleNamespace(id=uuid.uuid4()))
    fakes = {"get_run_context": lambda: context, "get_run_logger": lambda: logging.getLogger("bench.orchestration")}
    fakes |= {name: (lambda *a, **k: None) for name in
              ("create_markdown_artifact", "create_progress_artifact", "update_progress_artifact", "create_table_artifact")}
    saved = []
    for mod in (flows.train, flows.evaluate):
        for name, obj in list(vars(mod).items()):
            repl = obj.fn if isinstance(obj, (Task, Flow)) else fakes.get(name)
            if isinstance(obj, Task) and runs is not None:  # timed like a task call of the flow (body = call)
                repl = _timed(obj.fn, lambda dt, n=obj.name: runs.append((n, dt, dt)))
            if repl is not None:
                saved.append((mod, name, obj))
                setattr(mod, name, repl)
    try:
        yield
    finally:
        for mod, name, obj in saved:
            setattr(mod, name, obj)


def run_loop(rollouts: int, tag: str, overrides: dict | None = None) -> dict:
    """flows/train.py's body, the same library calls in the same order, without Prefect."""
    import flows.train

    train_fn = flows.train.train.fn
    cfg = _config(tag, rollouts, overrides)
    marks, unsubscribe = _marks()
    out: dict = {}
    runs: list[tuple[str, float, float]] = []
    try:
        with without_prefect(runs), _cpu(out):
            summary = train_fn(cfg)
    finally:
        unsubscribe()
    return out | {"gaps_s": _gaps(marks), "last_reward": summary["last_reward"], "task_names": [n for n, _, _ in runs],
                  "task_body_s": [b for _, _, b in runs]}


def _gaps(marks: list[float]) -> list[float]:
    return [b - a for a, b in zip(marks, marks[1:])]


def bench(rollouts: int, repeats: int, overrides: dict | None = None) -> Result:
    import logging

    # Prefect's own loggers keep the level miles configures (PREFECT_LOGGING_LEVEL), as in a real run
    for name in ("mlflow", "alembic", "httpx", "uvicorn"):
        logging.getLogger(name).setLevel(logging.ERROR)
    t0 = time.perf_counter()
    run_flow(1, "flow-warmup", overrides)  # starts the ephemeral Prefect API (when PREFECT_API_URL is unset)
    warm_s = time.perf_counter() - t0
    runs: dict[str, list[dict]] = {"flow": [], "loop": []}
    for r in range(repeats):
        order = ("flow", "loop") if r % 2 == 0 else ("loop", "flow")
        for kind in order:
            out = (run_flow if kind == "flow" else run_loop)(rollouts, f"{kind}-{r}", overrides)
            runs[kind].append(out)
            print(f"[orchestration] {kind} run {r}: {out['total_s']:.2f} s, per rollout {statistics.median(out['gaps_s']):.3f} s, "
                  f"cpu {out['client_cpu_s']:.1f} s + server {out['server_cpu_s']:.1f} s, load {os.getloadavg()[0]:.1f}", flush=True)
    total = {k: summarize([o["total_s"] for o in v]) for k, v in runs.items()}
    gaps = {k: summarize([g for o in v for g in o["gaps_s"]]) for k, v in runs.items()}
    # CPU per rollout: this process, and the API server subprocess (all of it is Prefect's: the loop sends it nothing)
    cpu = {k: {part: summarize([o[f"{part}_cpu_s"] / rollouts for o in v]) for part in ("client", "server")} for k, v in runs.items()}
    pairs = [f["total_s"] / lp["total_s"] - 1 for f, lp in zip(runs["flow"], runs["loop"])]
    # per-rollout overhead of each back-to-back pair (flow run r, loop run r): this machine's speed drifts by
    # +-15% over seconds (the same fixed work), so a difference of two pooled medians can swing by more than
    # the overhead; the median over pairs is the figure, pooled medians are kept for reference
    pair_gap = [statistics.median(f["gaps_s"]) - statistics.median(lp["gaps_s"]) for f, lp in zip(runs["flow"], runs["loop"])]
    pair_rel = [d / statistics.median(lp["gaps_s"]) for d, lp in zip(pair_gap, runs["loop"])]
    per_rollout = statistics.median(pair_gap)
    # direct: Prefect's task engine on the flow's thread, per rollout (every task run of the run, eval/save/prepare included)
    engine_per_rollout = [sum(o["task_engine_s"]) / rollouts for o in runs["flow"]]
    by_task: dict[str, list[float]] = {}
    for o in runs["flow"]:
        for name, e in zip(o["task_names"], o["task_engine_s"]):
            by_task.setdefault(name, []).append(e)
    engine = summarize(engine_per_rollout)
    steady = sum(statistics.median(by_task[k]) for k in PER_ROLLOUT_TASKS if k in by_task)  # the task runs every rollout makes
    # the library work inside the per-rollout tasks (the task bodies), flow vs loop: the same calls, slowed in the
    # flow by Prefect's work beside them (API server, event loop thread) on the shared cores
    bodies = {kind: {k: statistics.median(b for o in v for n, b in zip(o["task_names"], o["task_body_s"]) if n == k)
                     for k in PER_ROLLOUT_TASKS} for kind, v in runs.items()}
    body_sum = {kind: sum(b.values()) for kind, b in bodies.items()}
    step = {k: (overrides or {}).get(k) for k in ("rollout_batch_size", "n_samples_per_prompt", "rollout_max_response_len")}
    res = Result("orchestration", {"recipe": "tiny", "overrides": overrides or {}, "rollouts": rollouts, "repeats": repeats,
                                   "prefect_api": "ephemeral (PREFECT_API_URL unset)" if not _api_url() else _api_url(),
                                   "prefect_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("PREFECT_")
                                                   and k not in ("PREFECT_HOME", "PREFECT_LOCAL_STORAGE_PATH")}})
    res.figures = {"total_s": total, "per_rollout_s": gaps, "cpu_per_rollout_s": cpu, "first_flow_with_api_start_s": warm_s,
                   "task_engine_per_rollout_s": engine, "task_runs_per_flow_run": statistics.median(o["task_runs"] for o in runs["flow"]),
                   "task_engine_per_task_run_s": {k: summarize(v) for k, v in sorted(by_task.items())},
                   "task_body_median_s": bodies, "task_body_per_rollout_s": body_sum,
                   "raw": {k: [{x: o[x] for x in ("total_s", "client_cpu_s", "server_cpu_s", "gaps_s")} for o in v] for k, v in runs.items()}}
    res.ratios = {"run_overhead_pct": 100 * statistics.median(pairs),
                  "per_rollout_overhead_s": per_rollout, "per_rollout_overhead_pct": 100 * statistics.median(pair_rel),
                  "per_rollout_overhead_pooled_s": gaps["flow"]["median"] - gaps["loop"]["median"],
                  "task_engine_per_rollout_s": engine["median"], "task_engine_per_rollout_pct": 100 * engine["median"] / gaps["loop"]["median"],
                  "task_engine_steady_per_rollout_s": steady, "task_engine_steady_per_rollout_pct": 100 * steady / gaps["loop"]["median"],
                  "task_body_slowdown_per_rollout_s": body_sum["flow"] - body_sum["loop"],
                  "client_cpu_overhead_per_rollout_s": cpu["flow"]["client"]["median"] - cpu["loop"]["client"]["median"],
                  "server_cpu_per_rollout_s": cpu["flow"]["server"]["median"]}
    res.noise = {"run_overhead_pct_per_pair": [100 * p for p in pairs], "per_rollout_overhead_pct_per_pair": [100 * p for p in pair_rel],
                 "per_rollout_overhead_pct_pair_iqr": _iqr([100 * p for p in pair_rel]), "loop_total_rel_iqr": total["loop"]["rel_iqr"]}
    ms = lambda x: f"{x * 1000:.0f}"  # noqa: E731
    res.tables.append(table(
        ["", "whole run (s)", "per rollout (s)", "CPU per rollout: process (ms)", "CPU per rollout: API server (ms)"],
        [["Prefect flow", fmt_stat(total["flow"]), fmt_stat(gaps["flow"]), ms(cpu["flow"]["client"]["median"]), ms(cpu["flow"]["server"]["median"])],
         ["plain loop", fmt_stat(total["loop"]), fmt_stat(gaps["loop"]), ms(cpu["loop"]["client"]["median"]), ms(cpu["loop"]["server"]["median"])],
         ["overhead (median of pairs)", f"{res.ratios['run_overhead_pct']:+.1f}%",
          f"{per_rollout * 1000:+.0f} ms ({res.ratios['per_rollout_overhead_pct']:+.1f}%, pair IQR "
          f"{res.noise['per_rollout_overhead_pct_pair_iqr'][0]:+.1f} to {res.noise['per_rollout_overhead_pct_pair_iqr'][1]:+.1f}%)",
          f"{res.ratios['client_cpu_overhead_per_rollout_s'] * 1000:+.0f}", f"{res.ratios['server_cpu_per_rollout_s'] * 1000:+.0f}"]]))
    res.tables.append(table(
        ["Prefect task engine on the flow's thread", "per rollout (ms)", "share of a rollout of the plain loop"],
        [["all task runs / rollouts", _ms(engine), f"{res.ratios['task_engine_per_rollout_pct']:.1f}%"],
         [" + ".join(PER_ROLLOUT_TASKS) + " (medians)", f"{steady * 1000:.1f}", f"{res.ratios['task_engine_steady_per_rollout_pct']:.1f}%"]]
        + [[f"one `{k}` task run", _ms(summarize(v)), ""] for k, v in sorted(by_task.items())]))
    res.tables.append(table(
        ["library work inside the task (the task's body, medians, ms)", "flow", "loop", "flow - loop"],
        [[k, f"{bodies['flow'][k] * 1000:.1f}", f"{bodies['loop'][k] * 1000:.1f}", f"{(bodies['flow'][k] - bodies['loop'][k]) * 1000:+.1f}"]
         for k in PER_ROLLOUT_TASKS]
        + [["per rollout", f"{body_sum['flow'] * 1000:.1f}", f"{body_sum['loop'] * 1000:.1f}",
            f"{res.ratios['task_body_slowdown_per_rollout_s'] * 1000:+.1f}"]]))
    shape = ", ".join(f"{k} {v}" for k, v in step.items() if v is not None)
    res.notes += [
        f"tiny recipe{' with ' + shape if shape else ''}, {rollouts} rollouts per run (eval before training and at eval_interval, "
        f"checkpoint at the end), {repeats} flow runs and {repeats} loop runs alternating; medians (IQR).",
        f"first flow run of the process (starts the ephemeral Prefect API): {warm_s:.1f} s, not counted.",
        "overhead = median over the back-to-back pairs of (flow run - loop run); per rollout: of the runs' median gaps "
        "between rollout ends (the difference of the pooled medians above: "
        f"{res.ratios['per_rollout_overhead_pooled_s'] * 1000:+.0f} ms).",
        "task engine = a task call's wall time minus its body's (the task function: the same library call the loop makes), "
        "summed over the run's task runs (eval, save, prepare included) / rollouts: Prefect's own time on the flow's thread, "
        "measured directly in the flow runs; the API server and Prefect's event and log threads run beside it on the other core.",
        "library work inside the task: the same calls in both; in the flow they share the cores with Prefect's API "
        "server and its client threads, and a slower body there is Prefect's cost too, though not on the flow's thread.",
        "whole-run overhead includes the flow's fixed cost (flow run, prepare task, artifacts); per-rollout overhead is the "
        "steady cost of the 3-4 task runs per rollout. CPU per rollout = CPU of a whole run / rollouts (fixed costs included).",
    ]
    return res


def _ms(s: dict) -> str:
    return f"{s['median'] * 1000:.1f} ({s['p25'] * 1000:.1f}-{s['p75'] * 1000:.1f})"


def _iqr(xs: list[float]) -> list[float]:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return [q[0], q[2]]


def _api_url() -> str | None:
    import os

    return os.environ.get("PREFECT_API_URL")

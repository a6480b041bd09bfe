"""Two runs opening one new SQLite store at once (two flow runs of a deployment share its mlflow.db) both open it:
MLflow's table creation and the experiment are made by one process at a time (tracking/mlflow_tracker.store_turn)."""

from __future__ import annotations

import multiprocessing as mp

from mlflow.tracking import MlflowClient

from miles_core.tracking import MlflowTracker


def _open(uri: str, name: str, barrier, out) -> None:
    barrier.wait()  # all at once, on a store none of them has seen
    try:
        out.put((name, MlflowTracker(uri, "miles", run_name=name).run_id))
    except Exception as e:  # reported to the test, which names it
        out.put((name, f"error: {type(e).__name__}: {e}"))


def test_processes_opening_one_new_store_at_once_each_get_a_run_of_one_experiment(tmp_path):
    ctx = mp.get_context("fork")  # mlflow is imported here once: the children start at the barrier at once
    uri, n = f"sqlite:///{tmp_path / 'mlflow.db'}", 3
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_open, args=(uri, f"run{i}", barrier, out)) for i in range(n)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert not [v for v in got.values() if v.startswith("error")], got
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("miles").experiment_id])
    assert sorted(r.info.run_name for r in runs) == sorted(got) and {r.info.run_id for r in runs} == set(got.values())

"""flows/rundir.py (a deployment flow run's own run dir) and flows/crashed.py (a killed run's MLflow run marked
FAILED as crashed), on a real MLflow SQLite store and real run-dir locks."""

from __future__ import annotations

import json

from mlflow.tracking import MlflowClient

import flows  # noqa: F401  (environment first)
from flows.crashed import mark_crashed, sweep
from flows.links import FlowRun
from flows.rundir import for_flow_run
from miles_core import runlock
from flows.recipes import load_config


def test_each_deployment_flow_run_gets_its_own_run_dir_and_a_retry_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("MILES_RUNS_ROOT", str(tmp_path / "runs"))
    cfg = load_config("tiny")
    a, b = FlowRun("a" * 36, "brave-otter", None, "tiny"), FlowRun("b" * 36, "calm-fox", None, "tiny")
    ca, cb = for_flow_run(cfg, a), for_flow_run(cfg, b)
    assert ca.run_dir == tmp_path / "runs" / "tiny" / "brave-otter" and cb.run_dir == tmp_path / "runs" / "tiny" / "calm-fox"
    assert ca.save_dir != cb.save_dir
    assert ca.tracking_uri == cb.tracking_uri == f"sqlite:///{tmp_path / 'runs' / 'tiny' / 'mlflow.db'}"  # one runs table
    assert for_flow_run(cfg, a).run_dir == ca.run_dir  # a Retry: same flow-run id, same dir
    same_name = FlowRun("c" * 36, "brave-otter", None, "tiny")  # another flow run that drew the same name
    assert for_flow_run(cfg, same_name).run_dir == tmp_path / "runs" / "tiny" / "brave-otter-cccccccc"
    named = load_config("tiny", {"run_dir": str(tmp_path / "mine")})
    assert for_flow_run(named, b) == named  # a run dir named in the form is used as given
    # ... and a dir a deployment run made keeps logging into the store its mlflow_run.json records (the deployment's)
    (ca.run_dir / "mlflow_run.json").write_text(json.dumps({"run_id": "r1", "tracking_uri": ca.tracking_uri}))
    again = for_flow_run(load_config("tiny", {"run_dir": str(ca.run_dir)}), b)
    assert again.run_dir == ca.run_dir and again.tracking_uri == ca.tracking_uri != f"sqlite:///{ca.run_dir / 'mlflow.db'}"
    uri = f"sqlite:///{tmp_path / 'other.db'}"  # a store named in the form wins
    assert for_flow_run(load_config("tiny", {"run_dir": str(ca.run_dir), "mlflow_tracking_uri": uri}), b).tracking_uri == uri
    assert for_flow_run(cfg, FlowRun("d" * 36, "x", None, None)) == cfg  # a flow run outside a deployment (miles train)


def _crashed_run(run_dir, uri):
    client = MlflowClient(uri)
    exp = client.create_experiment("miles")
    run = client.create_run(exp)
    client.log_param(run.info.run_id, "checkpoint.save", "null")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "mlflow_run.json").write_text(json.dumps({"run_id": run.info.run_id, "tracking_uri": uri}))
    return client, run.info.run_id


def test_a_run_left_running_is_marked_crashed_unless_a_live_process_holds_its_dir(tmp_path):
    run_dir = tmp_path / "runs" / "tiny" / "brave-otter"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client, run_id = _crashed_run(run_dir, uri)
    lock = runlock.hold(load_config("tiny", {"run_dir": str(run_dir)}))
    try:
        assert sweep(tmp_path / "runs") == []  # held: the run is live
        assert client.get_run(run_id).info.status == "RUNNING"
    finally:
        lock.release()
    assert sweep(tmp_path / "runs") == [run_id]  # the holder is gone (the OS drops a killed process's lock)
    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["miles.failure"] == "crashed" and run.data.tags["miles.resume_from_rollout"] == "0"
    assert mark_crashed(run_dir) is None  # once

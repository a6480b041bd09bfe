"""MILES_FAULT_INJECT in whole train flows: a retried stage (generate, save, eval, export, register)
with one injected fault gives exactly the metrics of a clean run (Prefect reruns it); a stage that
is not retried (train, sync) fails the flow, and the rerun resumes from the checkpoint and matches.

One clean baseline run is shared; runs are tiny (2 rollouts of 2 prompts x 8 samples, evals on 8
prompts). Timings (perf/*, eval/duration_seconds) are the only metrics excluded.
"""

from __future__ import annotations

import logging

import pytest
from mlflow.tracking import MlflowClient

import flows  # noqa: F401
from miles_core import faults
from flows.recipes import load_config

pytestmark = pytest.mark.usefixtures("prefect_harness")
MODEL = "fault-test-model"


def _overrides(run_dir) -> dict:
    return {
        "run_dir": str(run_dir), "num_rollout": 2, "rollout_batch_size": 2, "num_threads": 1, "save_interval": 1,
        "eval_interval": 1, "eval_prompt_data": ["arith", "builtin://arith-test@[0:8]"], "export_interval": 1,
        "registered_model_name": MODEL, "champion_metric": "eval/arith", "log_samples": 0,
    }


def _config(run_dir):
    return load_config("tiny", _overrides(run_dir))


def _metrics(cfg) -> tuple[str, dict[str, list[tuple[int, float]]], list[str]]:
    """-> (run status, metric histories without timings, registered model versions)."""
    client = MlflowClient(cfg.tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("miles").experiment_id])
    out = {k: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, k))
           for k in run.data.metrics if not k.startswith("perf/") and k != "eval/duration_seconds"}
    versions = sorted(v.tags["rollout_id"] for v in client.search_model_versions(f"name='{MODEL}'"))
    return run.info.status, out, versions


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    from flows.train import train

    cfg = _config(tmp_path_factory.mktemp("clean") / "run")
    train(cfg)
    status, metrics, versions = _metrics(cfg)
    assert status == "FINISHED" and versions == ["0", "1"]
    assert [s for s, _ in metrics["eval/step"]] == [1, 2, 3]
    return metrics, cfg


@pytest.fixture
def fault_log(monkeypatch):
    faults.reset()
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    logger = logging.getLogger("miles_core.faults")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)
    faults.reset()


RETRIED = ("generate@1", "save@0", "eval@2", "export@1", "register@0")


def test_retried_stages_with_one_fault_each_give_the_clean_runs_metrics(tmp_path, monkeypatch, clean, fault_log):
    """One run, one fault in each retried stage (five specs in MILES_FAULT_INJECT): each stage faults once, Prefect
    reruns it, and the run ends with exactly the clean run's metrics and registered versions."""
    from flows.train import train

    monkeypatch.setenv(faults.FAULT_ENV, ",".join(RETRIED))
    cfg = _config(tmp_path / "run")
    train(cfg)
    assert len(fault_log) == len(RETRIED) and all(faults.FAULT_ENV in m for m in fault_log)
    for spec in RETRIED:  # each stage's one fault logged, naming the stage and its id
        stage, step = spec.split("@")
        assert sum(f"stage {stage} at {step} " in m for m in fault_log) == 1, (spec, fault_log)
    status, metrics, versions = _metrics(cfg)
    assert status == "FINISHED" and versions == ["0", "1"]  # a retried register adds no second version
    assert metrics == clean[0]


# sync@2 is the sync after checkpoint 0 and before the eval and export of rollout 0: the rerun runs what was due at
# the checkpoint's rollout and did not complete (the stage ledger, flows/train.py), so its metrics and exports match
@pytest.mark.parametrize("spec", ["train@1", "sync@2"])
def test_a_stage_not_retried_fails_the_flow_and_the_rerun_resumes_and_matches(tmp_path, monkeypatch, clean, fault_log, spec):
    from flows.train import train

    monkeypatch.setenv(faults.FAULT_ENV, spec)
    cfg = _config(tmp_path / "run")
    with pytest.raises(faults.InjectedFault, match=spec.split("@")[0]):
        train(cfg)
    assert len(fault_log) == 1
    assert _metrics(cfg)[0] == "FAILED"
    monkeypatch.delenv(faults.FAULT_ENV)
    summary = train(cfg)
    assert summary["resumed_from"] == 1
    status, metrics, versions = _metrics(cfg)
    assert status == "FINISHED" and versions == ["0", "1"]
    assert metrics == clean[0]


def test_a_run_failed_before_its_first_checkpoint_is_reattached_and_its_failure_tags_cleared(tmp_path, monkeypatch, clean, fault_log):
    """save@0x2: both attempts of the first save fail, so the flow fails with no checkpoint (as a kill before it would);
    the rerun re-attaches the run named in mlflow_run.json instead of opening a second one."""
    from flows.train import train

    monkeypatch.setenv(faults.FAULT_ENV, "save@0x2")
    cfg = _config(tmp_path / "run")
    with pytest.raises(faults.InjectedFault):
        train(cfg)
    client = MlflowClient(cfg.tracking_uri)
    (failed,) = client.search_runs([client.get_experiment_by_name("miles").experiment_id])
    assert failed.info.status == "FAILED" and "miles.failure" in failed.data.tags
    monkeypatch.delenv(faults.FAULT_ENV)
    summary = train(cfg)
    assert summary["mlflow_run_id"] == failed.info.run_id and summary["resumed_from"] == 0
    (run,) = client.search_runs([client.get_experiment_by_name("miles").experiment_id])
    assert run.info.status == "FINISHED" and not {"miles.failure", "miles.resume_from_rollout"} & set(run.data.tags)
    assert _metrics(cfg)[1] == clean[0]


def test_a_refused_rerun_leaves_the_finished_run_as_it_was(clean):
    from flows.train import train

    metrics, cfg = clean
    changed = load_config("tiny", {**_overrides(cfg.run_dir), "lr": 3e-4})
    with pytest.raises(Exception, match=r"changed params \['algo.lr'\]"):
        train(changed)
    client = MlflowClient(cfg.tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("miles").experiment_id])
    assert run.info.status == "FINISHED" and "miles.failure" not in run.data.tags
    assert _metrics(cfg)[1] == metrics

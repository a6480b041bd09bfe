"""Failure paths of the train flow: the MLflow run ends FAILED with a resume hint; a resume with
changed params is refused unless a new run is asked for."""

from __future__ import annotations

import re
import socket

import pytest
from mlflow.tracking import MlflowClient

import flows  # noqa: F401
from miles_core.config import ConfigError
from flows.recipes import load_config


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


NAN_RM = "def reward(sample):\n    return float('nan')\n"


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("failure", ["remote reward down", "custom reward NaN"])
def test_failed_flow_marks_mlflow_run_failed(failure, tmp_path, tiny_model_dir, monkeypatch):
    """A reward that cannot be had fails the run at rollout 0: FAILED in MLflow with the resume hint and the cause,
    and nothing trained on it is saved (a NaN reward never reaches a step, a checkpoint or an export)."""
    from flows.train import train
    from miles_core.checkpoint import list_checkpoints

    if failure == "remote reward down":
        source, cause = {"rm_type": "remote_rm", "rm_url": f"http://127.0.0.1:{_closed_port()}/score", "rm_max_retries": 0,
                         "rm_timeout": 1}, "127.0.0.1"
    else:
        (tmp_path / "nan_rm.py").write_text(NAN_RM)
        monkeypatch.syspath_prepend(str(tmp_path))
        source, cause = {"custom_rm_path": "nan_rm:reward"}, r"nan_rm.* returned nan"
    cfg = load_config("tiny", {"run_dir": str(tmp_path / "run"), "num_rollout": 2, "rollout_batch_size": 2, "save_interval": 1,
                               "skip_eval_before_train": True, **source})
    with pytest.raises(Exception, match=cause):
        train(cfg)
    client = MlflowClient(cfg.tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("miles").experiment_id])
    assert run.info.status == "FAILED"
    assert run.data.tags["miles.resume_from_rollout"] == "0"
    assert re.search(cause, run.data.tags["miles.failure"])
    assert list_checkpoints(cfg.save_dir) == [] and not any(cfg.export_dir.glob("*"))


@pytest.mark.usefixtures("prefect_harness")
def test_resume_with_changed_params_is_refused_unless_new_run(tmp_path, tiny_model_dir):
    from flows.train import train

    base = {"run_dir": str(tmp_path / "run"), "rollout_batch_size": 2, "skip_eval_before_train": True, "eval_interval": 100}
    first = train(load_config("tiny", {**base, "num_rollout": 1}))
    with pytest.raises(ConfigError, match=r"changed params \['algo.lr'\]"):
        train(load_config("tiny", {**base, "num_rollout": 2, "lr": 3e-4}))
    extended = train(load_config("tiny", {**base, "num_rollout": 2}))  # only the length changed: same run
    assert extended["mlflow_run_id"] == first["mlflow_run_id"] and extended["resumed_from"] == 1
    fresh = train(load_config("tiny", {**base, "num_rollout": 3, "lr": 3e-4, "mlflow_new_run": True}))
    assert fresh["mlflow_run_id"] != first["mlflow_run_id"] and fresh["resumed_from"] == 2
    with pytest.raises(ConfigError, match=r"nothing to do: .* already has all 3 rollouts .*--num-rollout"):  # not a Completed no-op
        train(load_config("tiny", {**base, "num_rollout": 3, "lr": 3e-4}))


@pytest.mark.usefixtures("prefect_harness")
def test_a_task_past_its_configured_timeout_fails_the_flow(tmp_path, tiny_model_dir):
    """task_timeouts: train (rollout 0's forward, backward and step: ~0.1-0.2 s of Python-driven torch ops here, no
    retries) times out, and the run fails naming it. Not prepare: Prefect enforces a sync timeout by an exception the
    watcher thread injects at the next bytecode (prefect/_internal/concurrency/cancellation.py WatcherThreadCancelScope),
    and a warm-cache prepare could leave the scope before the starved watcher ran (the full suite on 2 CPUs did once)."""
    from flows.train import train

    cfg = load_config("tiny", {"run_dir": str(tmp_path / "run"), "num_rollout": 1, "rollout_batch_size": 2,
                               "skip_eval_before_train": True, "task_timeouts": {"train": 0.01}})
    with pytest.raises(Exception, match=r"timed out after 0\.01 second"):
        train(cfg)

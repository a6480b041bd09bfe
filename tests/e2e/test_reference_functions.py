"""A reward file and a dynamic-sampling filter file written for the reference system (first parameter ``args``,
dict reward, ``DynamicFilterOutput``) run through ``miles train tiny`` unchanged: real CLI, Prefect, MLflow."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

import flows  # noqa: F401  (environment first)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "reference"


@pytest.mark.usefixtures("prefect_harness")
def test_reference_reward_and_filter_files_train(tmp_path, tiny_model_dir, monkeypatch):
    from flows.cli import app

    monkeypatch.syspath_prepend(str(FIXTURES))
    run_dir = tmp_path / "run"
    args = ["train", "tiny", "--run-dir", str(run_dir), "--num-rollout", "2", "--rollout-batch-size", "2",
            "--over-sampling-batch-size", "4", "--custom-rm-path", "reference_style_rm.reward_func", "--reward-key", "score",
            "--dynamic-sampling-filter-path", "reference_style_rm.filter_func", "--skip-eval-before-train",
            "--eval-prompt-data", "arith builtin://arith-test@[0:4]"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("miles").experiment_id])
    assert run.info.status == "FINISHED"
    keys = set(run.data.metrics)
    assert {"rollout/raw_reward", "train/pg_loss", "eval/arith"} <= keys
    # every group the filter kept has a reward spread; every group it dropped is counted under its own reason
    drops = [k for k in keys if k.startswith("rollout/dynamic_filter/drop_")]
    assert all(k.startswith("rollout/dynamic_filter/drop_ref_zero_std_") for k in drops), drops
    zero_std = [k for k in keys if k.startswith("rollout/zero_std/count_")]
    assert zero_std == [], zero_std  # the filter dropped every constant group before training

"""The eval flow over a real training run: checkpoints of a save dir evaluated into the training
run at their eval/step, idempotent on a rerun, incomplete snapshots recorded as ckpt_missing, a
linked run when the training run is gone (with an eval config file), snapshot eval in the train
flow, and a custom skip reason from eval_function_path."""

from __future__ import annotations

import shutil

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

import flows  # noqa: F401  (environment first)
from flows.recipes import load_config
from miles_core.evaluation import EvalSkip

SMALL = {"num_rollout": 3, "rollout_batch_size": 2, "save_interval": 1, "eval_interval": 100, "skip_eval_before_train": True,
         "eval_prompt_data": ["arith", "builtin://arith-test@[0:8]"], "n_samples_per_eval_prompt": 2, "log_samples": 0}


def no_judge(request):
    raise EvalSkip("no_judge")


def _steps(client, run_id, key):
    return sorted(m.step for m in client.get_metric_history(run_id, key))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir, prefect_harness):
    from flows.train import train

    cfg = load_config("tiny", {**SMALL, "run_dir": str(tmp_path_factory.mktemp("eval") / "run"), "export_interval": 2})
    return cfg, train(cfg)


def test_eval_over_save_dir_lands_in_the_training_run_once(trained):
    from flows.evaluate import evaluate

    cfg, summary = trained
    run_id = summary["mlflow_run_id"]
    client = MlflowClient(cfg.tracking_uri)
    assert _steps(client, run_id, "eval/arith") == [4]  # the train flow evaluated the last rollout (weight version 4)

    first = evaluate(str(cfg.save_dir), "all")
    assert first["mlflow_run_id"] == run_id and not first["linked_run"]
    assert first["evaluated"] == [2, 3] and first["already_evaluated"] == [4]  # checkpoints of rollouts 0, 1, 2
    assert _steps(client, run_id, "eval/arith") == [2, 3, 4]
    for m in client.get_metric_history(run_id, "eval/arith/weight_version/mean"):
        assert m.value == m.step  # the weights evaluated are the version the train flow would have evaluated
    assert {m.step: m.value for m in client.get_metric_history(run_id, "eval/step")} == {2: 2, 3: 3, 4: 4}
    lag = {m.step: m.value for m in client.get_metric_history(run_id, "eval/lag_steps")}
    assert lag == {2: 2.0, 3: 1.0}  # the trainer ended at weight version 4
    assert _steps(client, run_id, "eval/export_time_seconds") == [2, 3]
    artifacts = {a.path for a in client.list_artifacts(run_id, "eval")}
    assert {"eval/samples_step_2.json", "eval/samples_step_3.json"} <= artifacts
    assert not list((cfg.run_dir / "eval_snapshots" / "eval-flow").iterdir())  # converted checkpoints are removed after their eval

    again = evaluate(str(cfg.save_dir), "all")
    assert again["evaluated"] == [] and again["already_evaluated"] == [2, 3, 4]
    assert _steps(client, run_id, "eval/arith") == [2, 3, 4]  # nothing logged twice
    assert client.get_run(run_id).info.status == "FINISHED"


def test_export_dir_incomplete_snapshot_is_ckpt_missing_once(trained):
    from flows.evaluate import evaluate

    cfg, summary = trained
    assert sorted(p.name for p in cfg.export_dir.iterdir()) == ["1", "2"]
    broken = cfg.export_dir / "5"
    shutil.copytree(cfg.export_dir / "2", broken)
    (broken / ".complete").unlink()  # an export interrupted before its marker
    result = evaluate(str(cfg.export_dir), "all")
    assert result["skipped"] == {7: "ckpt_missing"} and result["already_evaluated"] == [3, 4]  # rollout 5 -> version 7
    client = MlflowClient(cfg.tracking_uri)
    assert _steps(client, summary["mlflow_run_id"], "eval/skipped_ckpt_missing") == [7]
    evaluate(str(cfg.export_dir), "all")
    assert _steps(client, summary["mlflow_run_id"], "eval/skipped_ckpt_missing") == [7]  # logged once
    assert 7 not in _steps(client, summary["mlflow_run_id"], "eval/step")
    shutil.rmtree(broken)


def test_cli_latest_then_linked_run_when_training_run_is_gone(trained, tmp_path):
    from flows.cli import app

    cfg, summary = trained
    client = MlflowClient(cfg.tracking_uri)
    result = CliRunner().invoke(app, ["eval", str(cfg.save_dir)])
    assert result.exit_code == 0, result.output
    assert "already evaluated" in result.output and "[4]" in result.output

    client.delete_run(summary["mlflow_run_id"])
    eval_cfg = tmp_path / "eval.yaml"
    eval_cfg.write_text("eval:\n  defaults: {max_response_len: 6}\n  datasets:\n"
                        "    - {name: hard, path: 'builtin://arith-test@[8:12]', n_samples_per_eval_prompt: 4, temperature: 0.7}\n")
    from flows.evaluate import evaluate

    overrides = {"eval_prompt_data": None, "eval_config": str(eval_cfg)}
    first = evaluate(str(cfg.save_dir / "1"), overrides=overrides)  # one checkpoint dir: rollout 1 -> version 3
    assert first["linked_run"] and first["mlflow_run_id"] != summary["mlflow_run_id"] and first["evaluated"] == [3]
    linked = client.get_run(first["mlflow_run_id"])
    assert linked.data.tags["miles.eval_of"] == summary["mlflow_run_id"]
    assert linked.data.metrics["eval/hard-pass_4"] >= 0 and "eval/arith" not in linked.data.metrics
    second = evaluate(str(cfg.save_dir / "1"), overrides=overrides)
    assert second["mlflow_run_id"] == first["mlflow_run_id"] and second["evaluated"] == []


@pytest.mark.usefixtures("prefect_harness")
def test_snapshot_eval_in_the_train_flow_and_custom_skip(tmp_path, tiny_model_dir):
    from flows.train import train

    snap = load_config("tiny", {**SMALL, "run_dir": str(tmp_path / "snap"), "eval_interval": 1, "skip_eval_before_train": False,
                                "eval_mode": "snapshot", "eval_keep_snapshots": 1, "save_interval": 100})
    summary = train(snap)
    client = MlflowClient(snap.tracking_uri)
    run_id = summary["mlflow_run_id"]
    assert _steps(client, run_id, "eval/arith") == [1, 2, 3, 4]  # before training, then after each rollout
    for m in client.get_metric_history(run_id, "eval/arith/weight_version/mean"):
        assert m.value == m.step
    assert _steps(client, run_id, "eval/export_time_seconds") == [1, 2, 3, 4]
    assert all(m.value >= 0 for m in client.get_metric_history(run_id, "eval/lag_steps"))
    assert sorted(p.name for p in (snap.run_dir / "eval_snapshots").iterdir()) == ["4"]  # eval_keep_snapshots 1
    assert client.get_run(run_id).info.status == "FINISHED"

    custom = load_config("tiny", {**SMALL, "run_dir": str(tmp_path / "custom"), "num_rollout": 1,
                                  "eval_function_path": f"{__name__}:no_judge"})
    summary = train(custom)
    metrics = MlflowClient(custom.tracking_uri).get_run(summary["mlflow_run_id"]).data.metrics
    assert metrics["eval/skipped_no_judge"] == 1.0 and "eval/arith" not in metrics and "eval/step" not in metrics

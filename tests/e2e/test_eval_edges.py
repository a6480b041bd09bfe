"""`miles eval` edge cases: a save dir outside the run dir finds its run's MLflow store (the checkpoint
records the tracking URI); a save dir without a complete checkpoint is an error, not "evaluated: none"."""

from __future__ import annotations

import pytest

import flows  # noqa: F401
from flows.recipes import load_config

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_eval_of_a_save_dir_outside_the_run_dir_logs_into_the_training_run(tmp_path, tiny_model_dir):
    from flows.evaluate import evaluate
    from flows.train import train

    cfg = load_config("tiny", {"run_dir": str(tmp_path / "run"), "save": str(tmp_path / "elsewhere" / "ckpt"), "num_rollout": 1,
                               "rollout_batch_size": 2, "skip_eval_before_train": True, "eval_interval": 100,
                               "eval_prompt_data": ["arith", "builtin://arith-test@[0:4]"]})
    summary = train(cfg)
    result = evaluate(str(cfg.save_dir), "latest", {"eval_prompt_data": ["other", "builtin://arith-test@[4:8]"]})
    assert result["mlflow_run_id"] == summary["mlflow_run_id"] and result["tracking_uri"] == cfg.tracking_uri
    assert not result["linked_run"] and result["already_evaluated"] == [2]  # the train flow evaluated after its last rollout


def test_eval_of_a_save_dir_without_a_checkpoint_is_an_error(tmp_path):
    from flows.evaluate import evaluate

    (tmp_path / "save" / "0" / "model").mkdir(parents=True)  # a checkpoint cut short: no .complete manifest
    (tmp_path / "save" / "latest").write_text("0")
    with pytest.raises(FileNotFoundError, match="no complete checkpoint or HF snapshot to evaluate"):
        evaluate(str(tmp_path / "save"))

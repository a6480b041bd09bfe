"""use_pytorch_profiler through the train flow: the traces land in the run's TensorBoard dir and in MLflow under
profile/ (a real Prefect engine and SQLite store; the trace contents: tests/training/test_profiler.py)."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

import flows  # noqa: F401  (environment first)
from flows.recipes import load_config
from miles_core.training.profiler import TRACE_SUFFIX


@pytest.mark.usefixtures("prefect_harness")
def test_the_train_flow_logs_the_traces_of_the_selected_rollouts_to_mlflow(tmp_path, tiny_model_dir):
    from flows.train import train

    cfg = load_config("tiny", {"run_dir": str(tmp_path / "run"), "num_rollout": 2, "rollout_batch_size": 2,
                               "n_samples_per_prompt": 4, "eval_prompt_data": None, "use_pytorch_profiler": True,
                               "profile_step_start": 1, "profile_step_end": 2})
    summary = train(cfg)
    traces = sorted(p.name for p in cfg.tensorboard_root.iterdir() if p.name.endswith(TRACE_SUFFIX))
    assert len(traces) == 1 and traces[0].startswith("train_overall_rank_0.")  # rollout 1's step only
    client = MlflowClient(cfg.tracking_uri)
    logged = [a for a in client.list_artifacts(summary["mlflow_run_id"], "profile")]
    assert [a.path for a in logged] == [f"profile/{traces[0]}"]
    assert logged[0].file_size == (cfg.tensorboard_root / traces[0]).stat().st_size

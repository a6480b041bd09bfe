"""The walking skeleton end to end: the tiny recipe through the real Prefect engine and a real
MLflow SQLite store learns, and the CLI output reads cleanly."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import flows  # noqa: F401  (environment first)
from miles_core.config import load_config

ROOT = Path(__file__).resolve().parents[2]
# Margin: the warm-up boxes 30% of answers, so the first rollouts score ~0.05-0.15; RL learns the
# format within ~15 rollouts (seen: 0.07 -> 0.40 over 30, 0.07 -> 0.35 over 20 with seed 1234).
# 0.15 is well above the rollout-to-rollout noise of a mean over 64 samples (std ~0.06).
MARGIN = 0.15


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


@pytest.mark.usefixtures("prefect_harness")
def test_tiny_recipe_learns_and_tracks(tmp_path, tiny_model_dir):
    from flows.train import train

    cfg = load_config("tiny", {"run_dir": str(tmp_path / "run"), "num_rollout": 20, "eval_interval": 10})
    summary = train(cfg)
    client = MlflowClient(cfg.tracking_uri)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    # params = the flattened resolved config
    assert run.data.params["rollout.rollout_batch_size"] == "8" and run.data.params["algo.advantage_estimator"] == "grpo"
    assert run.data.params["derived.global_batch_size"] == "64"

    reward = _history(client, run.info.run_id, "rollout/raw_reward")
    assert [s for s, _ in reward] == list(range(20))  # one value per rollout step, none missing or duplicated
    first, last = statistics.fmean(v for _, v in reward[:3]), statistics.fmean(v for _, v in reward[-3:])
    assert last > first + MARGIN, (first, last, reward)

    diff = _history(client, run.info.run_id, "train/train_rollout_logprob_abs_diff")
    assert len(diff) == 20 and max(v for _, v in diff) < 1e-5
    assert [s for s, _ in _history(client, run.info.run_id, "train/step")] == list(range(20))
    evals = _history(client, run.info.run_id, "eval/arith")
    assert [s for s, _ in evals] == [1, 11, 21]  # before training (weight version 1), after rollouts 9 and 19
    assert evals[-1][1] > evals[0][1]
    versions = _history(client, run.info.run_id, "eval/arith-weight_version/mean")
    assert [s for s, _ in versions] == [v for _, v in versions]  # eval/step == the engine's weight version
    for key in ("rollout/response_len/mean", "rollout/truncated_ratio", "passrate/pass_8", "perf/rollout_time",
                "train/pg_loss", "train/grad_norm", "train/lr-pg_0", "perf/update_weights_time", "rollout/advantages"):
        assert _history(client, run.info.run_id, key), key
    # the checkpoint of the last rollout and the rollouts on disk
    assert (cfg.save_dir / "latest").exists()
    assert sorted(int(p.stem) for p in (cfg.run_dir / "rollouts").glob("*.pt")) == list(range(20))


def test_cli_output_reads_cleanly(tmp_path, tiny_model_dir):
    env = {**os.environ, "COLUMNS": "120"}
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "train", "tiny", "--run-dir", str(tmp_path / "cli"), "--num-rollout", "2",
         "--eval-interval", "100"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Traceback" not in out and "ERROR" not in out, out
    assert "MLflow run id" in out and "mean reward" in out and "2/2" in out

"""The walking skeleton end to end: the tiny recipe through the real Prefect engine and a real
MLflow SQLite store learns (the CLI's output is checked by tests/docs/test_quickstart.py)."""

from __future__ import annotations

import statistics

import pytest
from mlflow.tracking import MlflowClient

import flows  # noqa: F401  (environment first)
from flows.recipes import load_config

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
    versions = _history(client, run.info.run_id, "eval/arith/weight_version/mean")
    assert [s for s, _ in versions] == [v for _, v in versions]  # eval/step == the engine's weight version
    for key in ("rollout/response_len/mean", "rollout/truncated_ratio", "passrate/pass_8", "perf/rollout_time",
                "train/pg_loss", "train/grad_norm", "train/lr-pg_0", "perf/update_weights_time", "rollout/advantages"):
        assert _history(client, run.info.run_id, key), key
    # the checkpoint of the last rollout and the rollouts on disk
    assert (cfg.save_dir / "latest").exists()
    # rollout files kept after the final checkpoint: the newest keep_rollouts (4); older samples live in MLflow tables
    assert sorted(int(p.stem) for p in (cfg.run_dir / "rollouts").glob("*.pt")) == list(range(16, 20))

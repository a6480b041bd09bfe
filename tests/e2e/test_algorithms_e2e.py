"""The algorithm recipes end to end through the real Prefect engine and a real MLflow SQLite store:
PPO with a critic and GSPO learn on the tiny task, and so does GRPO in bf16; REINFORCE++ (reward-level KL), OPD (in-process
teacher) and MIS run and log their own metrics. Eval is off to keep the file fast.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import flows  # noqa: F401  (environment first)
from flows.recipes import load_config

# Learning margins over 20 rollouts (mean raw reward of the last 3 minus the first 3), recipe seed 1234.
# Seed sweep on 2 CPUs (2026-12-01, seeds 1234, 1, 2, 3, 4): ppo +0.17 +0.23 +0.22 +0.25 +0.17, gspo
# +0.15 +0.26 +0.22 +0.22 +0.21. 0.10 is about 60% of the smallest gain and twice the noise of a
# 3-rollout mean (~0.05). Over 12 rollouts the gains were +0.06 .. +0.16: too close to the noise for a
# fixed margin, so the runs are 20 rollouts (~1 s each on the tiny model).
NUM_LEARN = 20
MARGIN = {"tiny-ppo": 0.10, "tiny-gspo": 0.10, "tiny-bf16": 0.10}
# The tiny recipe on the Megatron trainer in fp32 (train_backend megatron, one rank), 20 rollouts: +0.20 +0.28 +0.23
# +0.26 over seeds 1234, 1, 2, 3. In bf16 (dtype bfloat16, fp32 main weights), 20 rollouts:
# torch +0.193 +0.281, megatron +0.172 +0.302 over seeds 1234, 1 (through the flow, 2 CPUs under a load average of
# ~25, 2026-12-01; 300-420 s a run there); 0.10 as for the fp32 recipes.
# The rollout/train log-prob gap in bf16 is the engine's bf16 weights against the trainer's fp32 weights under autocast:
# at most 3.6e-3 (torch) and 3.8e-3 (megatron) over those runs; 0.02 leaves 5x.
BF16_ABS_DIFF = 0.02


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def _train(recipe: str, tmp_path, **overrides):
    from flows.train import train

    cfg = load_config(recipe, {"run_dir": str(tmp_path / recipe), "eval_prompt_data": None, **overrides})
    summary = train(cfg)
    client = MlflowClient(cfg.tracking_uri)
    assert client.get_run(summary["mlflow_run_id"]).info.status == "FINISHED"
    return client, summary["mlflow_run_id"]


def _learned(client: MlflowClient, run_id: str, recipe: str) -> None:
    reward = _history(client, run_id, "rollout/raw_reward")
    assert [s for s, _ in reward] == list(range(NUM_LEARN))
    first, last = statistics.fmean(v for _, v in reward[:3]), statistics.fmean(v for _, v in reward[-3:])
    assert last > first + MARGIN[recipe], (recipe, first, last, reward)


@pytest.mark.usefixtures("prefect_harness")
def test_ppo_with_a_critic_learns(tmp_path, tiny_model_dir):
    client, run_id = _train("tiny-ppo", tmp_path, num_rollout=NUM_LEARN)
    _learned(client, run_id, "tiny-ppo")
    value_loss = _history(client, run_id, "train/critic-value_loss")
    assert [s for s, _ in value_loss] == list(range(NUM_LEARN))  # the critic trains every rollout
    assert [s for s, _ in _history(client, run_id, "train/pg_loss")] == list(range(1, NUM_LEARN))  # num_critic_only_steps 1
    values = [v for _, v in _history(client, run_id, "rollout/values")]
    assert values[0] == 0.0 and values[-1] > 0.05  # zero head at first, then it tracks the rewards
    for key in ("train/critic-value_clipfrac", "train/critic-lr-pg_0", "rollout/returns", "rollout/advantages"):
        assert len(_history(client, run_id, key)) == NUM_LEARN, key


@pytest.mark.usefixtures("prefect_harness")
def test_gspo_learns(tmp_path, tiny_model_dir):
    client, run_id = _train("tiny-gspo", tmp_path, num_rollout=NUM_LEARN)
    _learned(client, run_id, "tiny-gspo")
    assert [s for s, _ in _history(client, run_id, "train/pg_clipfrac")] == list(range(2 * NUM_LEARN))  # 2 steps each


@pytest.mark.usefixtures("prefect_harness")
def test_tiny_learns_in_bf16(tmp_path, tiny_model_dir):
    """`miles train tiny --dtype bfloat16`: fp32 main weights, bf16 engines. The Megatron trainer in bf16 goes through
    the flow in tests/e2e/test_resume.py (the SIGINT case, to its uninterrupted run's metrics and this file's log-prob
    bound), and its bf16 update of the fp32 main weights agrees with its fp32 one, which equals the torch trainer's, in
    tests/training/megatron_backend (20 Megatron bf16 rollouts here cost ~110 s of suite time on 2 CPUs)."""
    client, run_id = _train("tiny", tmp_path, num_rollout=NUM_LEARN, dtype="bfloat16")
    _learned(client, run_id, "tiny-bf16")
    params = client.get_run(run_id).data.params
    assert params["derived.trainer.main_dtype"] == "float32" and params["misc.dtype"] == "bfloat16"
    assert params["derived.trainer.autocast"] == "bfloat16"
    diff = [v for _, v in _history(client, run_id, "train/train_rollout_logprob_abs_diff")]
    assert len(diff) == NUM_LEARN and max(diff) < BF16_ABS_DIFF  # bf16 engines sample from the weights trained


SMOKE = {
    "tiny-rpp": ["rollout/reward_kl", "rollout/ref_log_probs", "train/pg_loss"],
    "tiny-opd": ["train/opd_reverse_kl", "rollout/opd_reverse_kl"],
    "tiny-mis": ["train/mis_is_ratio_mean_final", "train/mis_kl", "train/mis_tis_truncate_fraction",
                 "train/mis_rs_mask_fraction_low", "train/mis_training_ppl", "train/ois", "train/mis_batch_norm_factor"],
}
# tiny-mis runs with the reference system's own mis.yaml, unchanged (issue 20)
REFERENCE_MIS = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "mis.yaml"
OVERRIDES = {"tiny-mis": {"custom_config_path": str(REFERENCE_MIS)}}


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("recipe", sorted(SMOKE))
def test_recipe_runs_and_logs_its_metrics(recipe, tmp_path, tiny_model_dir):
    client, run_id = _train(recipe, tmp_path, num_rollout=2, **OVERRIDES.get(recipe, {}))
    for key in SMOKE[recipe]:
        assert [s for s, _ in _history(client, run_id, key)] in ([0, 1], [0, 1, 2, 3]), key
    reverse_kl = _history(client, run_id, "train/opd_reverse_kl")
    if recipe == "tiny-opd":  # the teacher is the student's starting point: no gap before the first update
        assert abs(reverse_kl[0][1]) < 1e-5 and abs(reverse_kl[1][1]) > 0

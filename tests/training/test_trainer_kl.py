"""Reference-model paths of the trainer: loss-level KL (use_kl_loss) and reward-level KL (kl_coef)."""

from __future__ import annotations

import copy

import pytest

from miles_core.training.torch_trainer import TorchTrainer

PAD = 0


@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3", "low_var_kl"])
def test_kl_loss_with_a_reference_model(lm, cfg, samples, kl_type):
    c = cfg(use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type=kl_type, num_steps_per_rollout=2)
    assert c.needs_ref_model
    policy = lm()
    trainer = TorchTrainer(policy, c, pad_id=PAD, ref_model=copy.deepcopy(policy).eval())
    rollout_metrics, steps = trainer.train_rollout(samples, [s.reward for s in samples], 0)
    assert rollout_metrics["rollout/ref_log_probs"] == pytest.approx(rollout_metrics["rollout/log_probs"])
    assert steps[0]["train/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before the first step
    assert abs(steps[1]["train/kl_loss"]) > 0  # the policy has moved


def test_kl_loss_with_zero_coef_needs_no_reference(lm, cfg, samples):
    c = cfg(use_kl_loss=True, kl_loss_coef=0.0)
    assert not c.needs_ref_model  # REFERENCE §3: loaded only if a coefficient is non-zero
    _, steps = TorchTrainer(lm(), c, pad_id=PAD).train_rollout(samples, [s.reward for s in samples], 0)
    assert "train/kl_loss" not in steps[0] and "train/pg_loss" in steps[0]


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"])
def test_reward_level_kl_gets_reference_log_probs(lm, cfg, samples, estimator):
    c = cfg(advantage_estimator=estimator, normalize_advantages=True, kl_coef=0.05, kl_loss_type="k3", num_steps_per_rollout=2)
    policy = lm()
    trainer = TorchTrainer(policy, c, pad_id=PAD, ref_model=lm(seed=9))  # a different reference: kl > 0
    rollout_metrics, steps = trainer.train_rollout(samples, [s.reward for s in samples], 0)
    assert rollout_metrics["rollout/reward_kl"] > 0
    assert "rollout/ref_log_probs" in rollout_metrics
    assert "train/kl_loss" not in steps[0]


def test_reward_level_kl_without_reference_fails_clearly(lm, cfg, samples):
    trainer = TorchTrainer(lm(), cfg(advantage_estimator="ppo", kl_coef=0.05), pad_id=PAD)
    with pytest.raises(ValueError, match="ref_log_probs"):
        trainer.train_rollout(samples, [s.reward for s in samples], 0)

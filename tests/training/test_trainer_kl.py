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


def test_ref_update_interval_gives_the_reference_the_policys_weights_and_a_checkpoint_keeps_them(lm, cfg, samples, tmp_path):
    """The reference's --ref-update-interval 2: after rollouts 1, 3, ... the reference takes the policy's weights (the
    next rollout's first KL is then 0), not after rollout 0; a checkpoint holds the updated reference and a resume
    restores it."""
    import torch

    from flows.recipes import load_config

    c = cfg(use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="k1", num_steps_per_rollout=2, ref_update_interval=2)
    policy = lm()
    initial = {k: v.clone() for k, v in policy.state_dict().items()}
    trainer = TorchTrainer(policy, c, pad_id=PAD, ref_model=copy.deepcopy(policy).eval())
    rewards = [s.reward for s in samples]

    def same(a: dict, b: dict) -> bool:
        return all(torch.equal(a[k], b[k]) for k in a)

    ref = trainer.engine.ref_model
    trainer.train_rollout(samples, rewards, 0)
    assert same(ref.state_dict(), initial) and not same(policy.state_dict(), initial)  # rollout 0: the reference is kept
    _, steps = trainer.train_rollout(samples, rewards, 1)
    assert steps[0]["train/kl_loss"] != pytest.approx(0.0, abs=1e-9)  # still the initial reference
    after_1 = {k: v.clone() for k, v in policy.state_dict().items()}
    assert same(ref.state_dict(), after_1)  # after rollout 1: the policy's weights
    _, steps = trainer.train_rollout(samples, rewards, 2)
    assert steps[0]["train/kl_loss"] == pytest.approx(0.0, abs=1e-7)  # policy == reference before rollout 2's first step
    assert same(ref.state_dict(), after_1)  # rollout 2: kept

    trainer.save(tmp_path, 2, {})
    fresh = TorchTrainer(lm(), c, pad_id=PAD, ref_model=lm().eval())  # the reference as loaded from ref_load
    fresh.restore(tmp_path)
    assert same(fresh.engine.ref_model.state_dict(), after_1)
    with pytest.raises(ValueError, match="ref_update_interval needs a reference model"):
        load_config("tiny", {"ref_update_interval": 2})
    with pytest.raises(ValueError, match="ref_update_interval is not supported yet with train_backend megatron"):
        load_config("tiny", {"ref_update_interval": 2, "use_kl_loss": True, "kl_loss_coef": 0.1, "runtime": "ray", "train_backend": "megatron"})

"""The Megatron trainer's PPO critic: on the same batch and weights its values, value loss, critic grad norm
and weight update equal the torch critic's (a critic-only rollout, then one training both); a ppo run
built by the backend's builder saves its critic in torch_dist and resumes exactly."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from miles_core.training.batch import make_batch
from miles_core.training.megatron import weights
from miles_core.training.megatron.trainer import MegatronTrainer
from miles_core.training.torch_trainer import TorchTrainer

PAD = 0
PPO = {"advantage_estimator": "ppo", "critic_lr": 1e-2, "num_critic_only_steps": 1, "gamma": 0.99, "lambd": 0.95,
       "value_clip": 0.05, "micro_batch_size": 2}


def _critic_hf(mega: MegatronTrainer) -> dict[str, torch.Tensor]:
    """The Megatron critic's tensors under the torch critic's names (body as HF, head as score)."""
    full = weights.gather_full(mega.engine.critic.module.module)
    return {**{k: v for k, v in weights.full_to_hf(full, mega.engine.args).items() if k.startswith("model.")},
            "score.weight": full["output_layer.weight"], "score.bias": full["output_layer.bias"]}


def test_ppo_critic_equals_the_torch_critic(megatron_world, tmp_path, lm, cfg, samples):
    hf = lm(seed=3)
    hf.save_pretrained(tmp_path)
    c = cfg(**PPO, num_steps_per_rollout=2)
    torch_trainer = TorchTrainer(copy.deepcopy(hf), c, pad_id=PAD)
    mega = MegatronTrainer(c, tmp_path, pad_id=PAD)
    before = {k: v.clone() for k, v in torch_trainer.engine.critic.module.state_dict().items()}
    assert _critic_hf(mega).keys() == before.keys() and all(torch.equal(_critic_hf(mega)[k], v) for k, v in before.items())
    rewards = [s.reward for s in samples]
    for rollout_id in (0, 1):  # critic only, then both
        torch_rollout, torch_steps = torch_trainer.train_rollout(samples, rewards, rollout_id)
        out = mega.train_rollout(samples, rewards, rollout_id)
        for key in ("rollout/values", "rollout/returns", "rollout/log_probs"):
            assert out.rollout[key] == pytest.approx(torch_rollout[key], rel=1e-5, abs=1e-7), (rollout_id, key)
        assert len(out.steps) == len(torch_steps) == 2
        for mine, theirs in zip(out.steps, torch_steps):
            assert set(mine) >= set(theirs) and ("train/pg_loss" in mine) == (rollout_id == 1)
            for key, value in theirs.items():
                assert mine[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (rollout_id, key)
    # the second step's values have moved off V_old, some past value_clip
    assert torch_steps[1]["train/critic-value_clipfrac"] > 0 and torch_rollout["rollout/values"] != 0
    batch = make_batch(samples, PAD)
    ours, theirs = mega.engine.critic.values(batch), torch_trainer.engine.critic.values(batch)
    assert theirs.abs().max() > 0.01 and (ours - theirs)[batch.loss_mask.bool()].abs().max() < 1e-5
    after = _critic_hf(mega)
    for name, t in torch_trainer.engine.critic.module.state_dict().items():
        update = t - before[name]
        assert (after[name] - before[name] - update).norm() <= 1e-3 * update.norm() + 1e-12, name


def test_a_ppo_run_through_the_builder_resumes_exactly(megatron_world, tmp_path, lm, cfg, samples):
    from miles_core.training.megatron import build_megatron_trainer
    from miles_core.training.protocol import TrainerContext

    lm(seed=4).save_pretrained(tmp_path / "hf")
    ctx = TrainerContext(cfg=cfg(**PPO, num_steps_per_rollout=2), model_path=tmp_path / "hf", tokenizer=SimpleNamespace(pad_token_id=PAD),
                         rank=0, world_size=1)
    rewards = [s.reward for s in samples]
    straight = build_megatron_trainer(ctx)
    straight.train_rollout(samples, rewards, 0)
    straight.save(tmp_path / "ckpt", 0, {})
    second = straight.train_rollout(samples, rewards, 1)
    assert (tmp_path / "ckpt" / "0" / "torch_dist").is_dir()

    resumed = build_megatron_trainer(ctx)
    assert resumed.restore(tmp_path / "ckpt")["rollout_id"] == 0
    again = resumed.train_rollout(samples, rewards, 1)
    assert again.steps == second.steps and "train/critic-value_loss" in again.steps[1]
    assert again.rollout["rollout/values"] == second.rollout["rollout/values"] != 0
    mine, theirs = _critic_hf(resumed), _critic_hf(straight)
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    with pytest.raises(ValueError, match="holds a critic and this run has none"):
        MegatronTrainer(cfg(), tmp_path / "hf", pad_id=PAD).restore(tmp_path / "ckpt")

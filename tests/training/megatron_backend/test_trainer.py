"""The Megatron trainer runs the torch trainer's math: one GRPO step on the same batch and weights gives
the same loss and grad norm (1e-5 relative) and the same weight update (within 1e-3 of its size)."""

from __future__ import annotations

import copy

import pytest
import torch

from miles_core.training.megatron.trainer import MegatronTrainer
from miles_core.training.torch_trainer import TorchTrainer

PAD = 0  # the tiny LM's pad id (tests/training/conftest.py)


def _updates(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before}


@pytest.mark.parametrize("overrides", [{}, {"use_kl_loss": True, "kl_loss_coef": 0.1, "entropy_coef": 0.01, "num_steps_per_rollout": 2,
                                            "micro_batch_size": 2}])
def test_grpo_step_equals_the_torch_trainer(megatron_world, tmp_path, lm, cfg, samples, overrides):
    hf = lm(seed=0)
    hf.save_pretrained(tmp_path)
    cfg = cfg(**overrides)
    rewards = [s.reward for s in samples]
    ref = copy.deepcopy(hf) if cfg.needs_ref_model else None
    torch_trainer = TorchTrainer(copy.deepcopy(hf), cfg, pad_id=PAD, ref_model=ref)
    mega = MegatronTrainer(cfg, tmp_path, pad_id=PAD)
    before = {k: v.clone() for k, v in hf.state_dict().items()}
    _, torch_steps = torch_trainer.train_rollout(samples, rewards)
    out = mega.train_rollout(samples, rewards)
    assert len(out.steps) == len(torch_steps) == cfg.num_steps_per_rollout
    for mine, theirs in zip(out.steps, torch_steps):
        for key in ("train/loss", "train/pg_loss", "train/grad_norm"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-7), key
        assert set(theirs) <= set(mine)
    ours, torch_upd = _updates(before, dict(mega.named_tensors())), _updates(before, torch_trainer.model.state_dict())
    for name, upd in torch_upd.items():
        assert (ours[name] - upd).norm() <= 1e-3 * upd.norm() + 1e-12, name

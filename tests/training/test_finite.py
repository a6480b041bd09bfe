"""The trainer's NaN/inf guard (miles_core/finite.py): no optimizer step on a non-finite loss or
grad norm, no checkpoint and no export of non-finite weights (issue 30, finding 1)."""

from __future__ import annotations

import pytest
import torch

from miles_core import checkpoint as ckpt
from miles_core.finite import NonFiniteTraining, check_loss_and_grad
from miles_core.training.torch_trainer import TorchTrainer

from .conftest import PAD, make_cfg, tiny_lm


def test_a_nan_loss_fails_the_step_naming_the_rollout_and_the_weights_stay(samples):
    model = tiny_lm()
    trainer = TorchTrainer(model, make_cfg(), pad_id=PAD)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rewards = [float("nan")] + [s.reward for s in samples[1:]]  # a NaN that got past the reward checks
    with pytest.raises(NonFiniteTraining, match="rollout 7, optimizer step 0: found NaN in the actor loss"):
        trainer.train_rollout(samples, rewards, rollout_id=7)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert not trainer.engine.optimizer.state  # AdamW never stepped: no moments were written


def test_an_inf_grad_norm_is_refused():
    with pytest.raises(NonFiniteTraining, match="found Inf in the critic grad norm"):
        check_loss_and_grad(0.5, torch.tensor(float("inf")), model="critic")
    check_loss_and_grad(None, 1.0, step=2)  # a rank without the loss (an early pipeline stage) checks the norm only


def test_non_finite_weights_are_never_checkpointed_nor_exported(tmp_path, tiny_tokenizer):
    model = tiny_lm()
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteTraining, match="checkpoint 2 in .*'model.layers.1.mlp.up_proj.weight' holds NaN"):
        ckpt.save_checkpoint(tmp_path / "save", 2, model=model, state={})
    with pytest.raises(NonFiniteTraining, match="export of rollout 2 .*up_proj.weight"):
        ckpt.export_hf(model, tiny_tokenizer, tmp_path / "export", 2)
    assert ckpt.find_latest(tmp_path / "save") is None
    assert not list((tmp_path / "export").glob("*")) if (tmp_path / "export").exists() else True

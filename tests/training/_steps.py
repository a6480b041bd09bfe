"""The trainer tests' torch trainer on the tiny recipe, and one recorded train_rollout."""

from __future__ import annotations

from flows.recipes import load_config
from miles_core.training.torch_trainer import TorchTrainer


def tiny_trainer(model, tok, **over):
    cfg = load_config("tiny", {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "lr": 1e-3, **over})
    return TorchTrainer(model, cfg, pad_id=tok.pad_token_id)


def one_step(model, tok, samples, rewards, **over):
    """One train_rollout; -> (rollout metrics, step metrics, gradients at optimizer.step, the trainer)."""
    trainer = tiny_trainer(model, tok, **over)
    grads, step = [], trainer.engine.optimizer.step

    def record(*a, **kw):
        grads.extend(p.grad.detach().clone() for p in model.parameters())
        return step(*a, **kw)

    trainer.engine.optimizer.step = record
    rollout, steps = trainer.train_rollout(samples, rewards)
    return rollout, steps[0], grads, trainer

"""torch_dist checkpoints: save after a rollout, restore into a fresh trainer, and the next rollout gives
exactly the uninterrupted run's metrics and weights; a checkpoint of another shape is refused by name."""

from __future__ import annotations

import pytest
import torch

from miles_core.training.megatron import checkpoint, optim
from miles_core.training.megatron.trainer import MegatronTrainer

PAD = 0


def _main_weights(trainer) -> list[torch.Tensor]:
    """The fp32 weights the optimizer steps: megatron's main copies (16-bit runs), else the parameters."""
    if hasattr(trainer.engine.optimizer, "prepare_grads"):
        return [m for _, m in optim.main_params(trainer.engine.optimizer)]
    return list(trainer.engine.params)


@pytest.mark.parametrize("dtype, distributed", [("float32", False), ("bfloat16", False), ("bfloat16", True)])
def test_resume_is_exact(megatron_world, tmp_path, lm, cfg, samples, dtype, distributed):
    """bf16: the checkpoint holds the fp32 main weights (a restore from the bf16 parameters would round them)."""
    lm(seed=2).save_pretrained(tmp_path / "hf")
    config = cfg(lr=3e-3, num_steps_per_rollout=2, dtype=dtype, runtime="ray", train_backend="megatron",
                 use_distributed_optimizer=distributed)
    rewards = [s.reward for s in samples]
    straight = MegatronTrainer(config, tmp_path / "hf", pad_id=PAD)
    first = straight.train_rollout(samples, rewards)
    straight.save(tmp_path / "ckpt", 0, {"data_source": {"offset": 8}})
    second = straight.train_rollout(samples, rewards)

    resumed = MegatronTrainer(config, tmp_path / "hf", pad_id=PAD)
    assert resumed.restore(tmp_path / "empty") is None
    state = resumed.restore(tmp_path / "ckpt")
    assert state["data_source"] == {"offset": 8} and state["rollout_id"] == 0 and resumed.steps_done == 2
    again = resumed.train_rollout(samples, rewards)
    assert again.steps == second.steps and again.steps != first.steps
    mine, theirs = dict(resumed.named_tensors()), dict(straight.named_tensors())
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert all(torch.equal(m, t) for m, t in zip(_main_weights(resumed), _main_weights(straight), strict=True))
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["0", "latest"]  # the temp dir is gone


def test_a_checkpoint_of_another_shape_is_named_and_keep_last_holds(megatron_world, tmp_path, lm, cfg, caplog):
    from flows.crashed import latest_meta, resume_rollout

    lm(seed=0).save_pretrained(tmp_path / "hf")
    trainer = MegatronTrainer(cfg(keep_last=2), tmp_path / "hf", pad_id=PAD)
    for rollout_id in (1, 2, 3):
        path = checkpoint.save(trainer.engine, tmp_path / "ckpt", rollout_id, {"mlflow_run_id": f"run-{rollout_id}"})
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["2", "3", "latest"]
    assert checkpoint.latest(tmp_path / "ckpt") == path
    # what a rerun reads before any model loads (the changed-params check, the crash mark): the Megatron layout's
    # meta, with no "skipping checkpoint" warning of the torch layout's scan
    assert latest_meta(tmp_path / "ckpt")["mlflow_run_id"] == "run-3" and resume_rollout(tmp_path / "ckpt") == 4
    assert "skipping" not in caplog.text
    wider = trainer.engine.args.__class__(**{**trainer.engine.args.__dict__, "hidden_size": 64})
    with pytest.raises(ValueError, match=r"another model shape: hidden_size 32 \(this model: 64\)"):
        checkpoint.check_args(path, wider)

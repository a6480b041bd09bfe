"""The torch trainer's models and batches on the device miles_core/device.py resolves (auto: cpu without CUDA).
No CUDA is faked: on a GPU machine the same tests check the CUDA placement."""

from __future__ import annotations

import torch

from miles_core.assemble import build_config
from miles_core.device import resolve_device

BASE = {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "prompt_data": "builtin://arith", "micro_batch_size": 4}


def test_torch_trainer_puts_policy_ref_critic_and_teacher_on_the_resolved_device(tiny_model_dir, tiny_tokenizer, samples):
    from miles_core.training.backends import build_torch_trainer
    from miles_core.training.protocol import TrainerContext

    cfg = build_config({**BASE, "hf_checkpoint": str(tiny_model_dir), "device": "auto", "advantage_estimator": "ppo",
                        "use_kl_loss": True, "kl_loss_coef": 0.1, "use_opd": True, "opd_teacher_load": str(tiny_model_dir)})
    trainer = build_torch_trainer(TrainerContext(cfg=cfg, model_path=tiny_model_dir, tokenizer=tiny_tokenizer))
    want = resolve_device("auto")
    modules = {"policy": trainer.engine.model, "ref": trainer.engine.ref_model, "critic": trainer.engine.critic.module, "teacher": trainer.engine.teacher.model}
    assert {name: {p.device for p in m.parameters()} for name, m in modules.items()} == {name: {want} for name in modules}
    assert trainer.engine.device == want
    out = trainer.train_rollout(samples, [s.reward for s in samples])  # batches go where the models are
    assert torch.isfinite(torch.tensor(out.steps[0]["train/grad_norm"]))


def test_batch_to_moves_every_field(samples):
    from miles_core.training.batch import make_batch

    batch = make_batch(samples, pad_id=0)
    moved = batch.to(resolve_device("auto"))
    for name in ("input_ids", "attention_mask", "resp_index", "resp_tokens", "loss_mask", "rollout_log_probs"):
        assert getattr(moved, name).device == resolve_device("auto")
        assert torch.equal(getattr(moved, name).cpu(), getattr(batch, name))

"""bf16 in the Megatron trainer: megatron-core's mixed-precision optimizer (Float16OptimizerWithFloat16Params, or the
DistributedOptimizer) keeps fp32 main weights, so AdamW at lr 1e-6 moves every tensor as an fp32 run does; the
model's own parameters stay bf16, and so do weight sync and exports."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from miles_core.training.megatron import optim
from miles_core.training.megatron.trainer import MegatronTrainer

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/training: the check shared with the torch trainer's test
from _precision import LR, bf16_qwen3, disagreements, train  # noqa: E402

PAD, VOCAB = 0, 48  # the trainer tests' tiny vocabulary (tests/training/conftest.py)

MEGATRON = {"runtime": "ray", "train_backend": "megatron"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return bf16_qwen3(tmp_path_factory.mktemp("qwen3"), VOCAB)


def _main_weights(trainer) -> dict[str, torch.Tensor]:
    """Megatron parameter name -> fp32 main weights (flat): the optimizer's, or the fp32 parameters themselves."""
    names = {p: n for n, p in trainer.engine.model.module.named_parameters()}
    if hasattr(trainer.engine.optimizer, "prepare_grads"):
        return {names[p]: m.detach().float().flatten().clone() for p, m in optim.main_params(trainer.engine.optimizer)}
    return {n: p.detach().float().flatten().clone() for p, n in names.items()}


def _update(model_dir, cfg, dtype: str, samples, distributed: bool):
    cfg = cfg(lr=LR, dtype=dtype, hf_checkpoint=str(model_dir), **MEGATRON, use_distributed_optimizer=distributed)
    trainer = MegatronTrainer(cfg, model_dir, pad_id=PAD)
    before = _main_weights(trainer)
    train(trainer, samples)
    return {k: v - before[k] for k, v in _main_weights(trainer).items()}, trainer


@pytest.mark.parametrize("distributed", [False, True])
def test_bf16_update_of_the_fp32_main_weights_agrees_with_fp32(megatron_world, model_dir, cfg, sample_factory, distributed):
    samples = sample_factory(seed=1)
    reference, _ = _update(model_dir, cfg, "float32", samples, distributed)
    update, trainer = _update(model_dir, cfg, "bfloat16", samples, distributed)
    assert disagreements(update, reference) == []
    assert {n: p.dtype for n, p in trainer.engine.model.module.named_parameters() if p.dtype != torch.bfloat16} == {}
    assert {t.dtype for _, t in trainer.named_tensors()} == {torch.bfloat16}
    # gradients accumulate and reduce in fp32 (DDP's grad_reduce_in_fp32 buffers), not in the bf16 parameters' dtype
    assert {p.main_grad.dtype for p in trainer.engine.params} == {torch.float32}


def test_bf16_export_writes_the_model_dtype(megatron_world, model_dir, cfg, sample_factory, tmp_path, tiny_tokenizer):
    """The HF snapshot of a bf16 run holds bf16 tensors, the ones weight sync sends (the fp32 main weights stay in
    the torch_dist checkpoint: test_checkpoint.py)."""
    from transformers import AutoModelForCausalLM

    trainer = MegatronTrainer(cfg(lr=LR, dtype="bfloat16", hf_checkpoint=str(model_dir), **MEGATRON), model_dir, pad_id=PAD)
    samples = sample_factory(seed=1)
    trainer.train_rollout(samples, [s.reward for s in samples], rollout_id=0)
    path = trainer.export(tmp_path, 0, tiny_tokenizer)
    exported = AutoModelForCausalLM.from_pretrained(path)
    assert exported.dtype == torch.bfloat16
    sent = dict(trainer.named_tensors())
    state = exported.state_dict()
    assert set(state) == set(sent) and all(torch.equal(state[k], sent[k]) for k in sent)

"""Mixed precision in the torch trainer (training/precision.py): a bf16 run keeps fp32 main weights, so AdamW at
the recipes' lr 1e-6 moves every tensor as an fp32 run does; weight sync and exports send bf16."""

from __future__ import annotations

import types

import pytest
import torch

from miles_core.training.backends import build_torch_trainer
from miles_core.training.protocol import TrainerContext

from ._precision import LR, bf16_qwen3, disagreements, train
from .conftest import PAD, VOCAB, make_cfg, make_samples

TOKENIZER = types.SimpleNamespace(pad_token_id=PAD)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return bf16_qwen3(tmp_path_factory.mktemp("qwen3"), VOCAB)


def _trainer(model_dir, dtype: str):
    cfg = make_cfg(lr=LR, dtype=dtype, hf_checkpoint=str(model_dir))
    return build_torch_trainer(TrainerContext(cfg=cfg, model_path=model_dir, tokenizer=TOKENIZER))


def _main_weights(trainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().float().clone() for name, p in trainer.engine.model.named_parameters()}


def _update(model_dir, dtype: str, samples) -> tuple[dict[str, torch.Tensor], object]:
    trainer = _trainer(model_dir, dtype)
    before = _main_weights(trainer)
    train(trainer, samples)
    return {k: v - before[k] for k, v in _main_weights(trainer).items()}, trainer


def test_bf16_update_of_the_fp32_main_weights_agrees_with_fp32(model_dir):
    samples = make_samples(seed=1)
    reference, _ = _update(model_dir, "float32", samples)
    update, trainer = _update(model_dir, "bfloat16", samples)
    assert disagreements(update, reference) == []
    assert {p.dtype for p in trainer.engine.model.parameters()} == {torch.float32}  # the main weights
    assert {t.dtype for _, t in trainer.named_tensors()} == {torch.bfloat16}  # what weight sync sends


def test_bf16_export_writes_the_model_dtype(model_dir, tmp_path, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    trainer = _trainer(model_dir, "bfloat16")
    path = trainer.export(tmp_path, 0, tiny_tokenizer)
    exported = AutoModelForCausalLM.from_pretrained(path)
    assert exported.dtype == torch.bfloat16
    sent = dict(trainer.named_tensors())
    for name, t in exported.state_dict().items():
        assert torch.equal(t, sent[name]), name


def test_a_trained_model_in_bf16_is_refused(model_dir):
    from transformers import AutoModelForCausalLM

    from miles_core.training.torch_trainer import TorchTrainer

    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="policy's parameters are \\['bfloat16'\\].*float32 main weights"):
        TorchTrainer(policy, make_cfg(dtype="bfloat16"), pad_id=PAD)


def test_bf16_resume_is_exact(model_dir, tmp_path):
    """The checkpoint holds the fp32 main weights and AdamW's state: the resumed run's next rollout is the straight run's."""
    samples = make_samples(seed=1)
    rewards = [s.reward for s in samples]
    straight = _trainer(model_dir, "bfloat16")
    straight.train_rollout(samples, rewards, rollout_id=0)
    straight.save(tmp_path, 0, {"data_source": {}})
    second = straight.train_rollout(samples, rewards, rollout_id=1)
    resumed = _trainer(model_dir, "bfloat16")
    resumed.restore(tmp_path)
    again = resumed.train_rollout(samples, rewards, rollout_id=1)
    assert again.steps == second.steps
    mine, theirs = _main_weights(resumed), _main_weights(straight)
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)

"""The Megatron trainer's in-process OPD teacher (use_opd with opd_teacher_load): a forward-only stage of the
teacher's own shape whose log-probs (temperature rule) equal the torch trainer's ModelTeacher's, and one OPD
step equals the torch trainer's."""

from __future__ import annotations

import copy

import pytest
import torch

from miles_core.training.batch import make_batch
from miles_core.training.megatron.trainer import MegatronTrainer
from miles_core.training.teacher import ModelTeacher
from miles_core.training.torch_trainer import TorchTrainer

from .conftest import tiny_hf

PAD = 0
VOCAB = 48  # the student lm's vocab (tests/training/conftest.py)


def test_teacher_log_probs_and_the_opd_step_equal_the_torch_trainer(megatron_world, tmp_path, lm, cfg, samples):
    student = lm(seed=0)
    student.save_pretrained(tmp_path / "student")
    teacher = tiny_hf("qwen3", seed=5, vocab=VOCAB)  # another family and width than the student: its own model args
    teacher.save_pretrained(tmp_path / "teacher")
    c = cfg(use_opd=True, opd_teacher_load=str(tmp_path / "teacher"), opd_kl_coef=0.5, rollout_temperature=0.7)
    mega = MegatronTrainer(c, tmp_path / "student", pad_id=PAD)
    assert mega.engine.teacher_model is not None and mega.engine.teacher_model.config.hidden_size == 64
    batch = make_batch(samples, PAD)
    theirs = ModelTeacher(copy.deepcopy(teacher), c.rollout.rollout_temperature, 3).log_probs(batch)  # [N, T]
    ours = mega.engine.compute_log_probs(mega.engine.teacher_model, batch)
    assert (ours - theirs)[batch.loss_mask.bool()].abs().max() < 1e-5
    assert (ours - mega.engine.compute_log_probs(mega.engine.model, batch)).abs().max() > 0.1  # the teacher, not the student

    torch_trainer = TorchTrainer(copy.deepcopy(student), c, pad_id=PAD, teacher=ModelTeacher(teacher, c.rollout.rollout_temperature, 3))
    rewards = [s.reward for s in samples]
    torch_rollout, torch_steps = torch_trainer.train_rollout(samples, rewards)
    out = mega.train_rollout(samples, rewards)
    assert abs(torch_rollout["rollout/opd_reverse_kl"]) > 0.01
    assert out.rollout["rollout/opd_reverse_kl"] == pytest.approx(torch_rollout["rollout/opd_reverse_kl"], rel=1e-5)
    for key in ("train/loss", "train/pg_loss", "train/opd_reverse_kl", "train/grad_norm"):
        assert out.steps[0][key] == pytest.approx(torch_steps[0][key], rel=1e-5, abs=1e-7), key


def test_a_teacher_of_another_vocabulary_is_refused(megatron_world, tmp_path, lm, cfg):
    lm(seed=0).save_pretrained(tmp_path / "student")
    tiny_hf("qwen2", vocab=VOCAB + 2).save_pretrained(tmp_path / "teacher")
    with pytest.raises(ValueError, match=r"teacher vocab_size 50 != student vocab_size 48"):
        MegatronTrainer(cfg(use_opd=True, opd_teacher_load=str(tmp_path / "teacher")), tmp_path / "student", pad_id=PAD)

"""OPD teachers: prefill scoring, in-process and engine teachers agree, teacher log-probs from the samples,
and the OPD metrics of a trainer rollout."""

from __future__ import annotations

import pytest
import torch

from miles_core.training.batch import make_batch, response_log_probs
from miles_core.models.scoring import score_tokens
from miles_core.training.teacher import EngineTeacher, ModelTeacher, load_teacher
from miles_core.training.torch_trainer import TorchTrainer

PAD = 0


class ScoringEngine:
    """What an engine's prefill-only score() does, on an in-process model."""

    def __init__(self, model):
        self.model = model
        self.calls = 0

    def score(self, input_ids_list, temperature):
        self.calls += 1
        return score_tokens(self.model, input_ids_list, temperature, micro_batch_size=3)


def test_score_tokens_hand_check(lm):
    model = lm()
    ids = [[5, 6, 7, 8], [9, 10]]
    scored = score_tokens(model, ids, temperature=0.5)
    assert [len(x) for x in scored] == [3, 1]  # L - 1 per sequence
    logits = model(input_ids=torch.tensor([ids[0]])).logits[0].float() / 0.5  # [L, V]
    expect = torch.log_softmax(logits, -1)[torch.arange(3), torch.tensor(ids[0][1:])]
    torch.testing.assert_close(torch.tensor(scored[0]), expect, atol=1e-5, rtol=1e-5)


def test_model_and_engine_teachers_agree_with_the_trainer_log_probs(lm, samples):
    model = lm(seed=3)
    batch = make_batch(samples, PAD)
    by_model = ModelTeacher(model, temperature=0.7, micro_batch_size=3).log_probs(batch)
    engine = ScoringEngine(model)
    by_engine = EngineTeacher(engine, temperature=0.7).log_probs(batch)
    direct, _ = response_log_probs(model, batch, 0.7, with_entropy=False)
    m = batch.loss_mask  # compare response tokens only (padding differs: micro-batches pad with 0)
    torch.testing.assert_close(by_model * m, direct * m, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(by_engine * m, by_model * m, atol=1e-5, rtol=1e-5)
    assert engine.calls == 1


def test_engine_teacher_checks_the_engine():
    with pytest.raises(TypeError, match="score"):
        EngineTeacher(object(), temperature=1.0)

    class Short:
        def score(self, ids, temperature):
            return [[0.0] for _ in ids]

    with pytest.raises(ValueError, match="expected"):
        EngineTeacher(Short(), 1.0).log_probs(make_batch([_long_sample()], PAD))


def _long_sample():
    from miles_core.data.sample import Sample

    return Sample(tokens=[3, 4, 5, 6], response_length=2, loss_mask=[1, 1], rollout_log_probs=[-1.0, -1.0])


def test_trainer_with_a_teacher_logs_reverse_kl(lm, cfg, samples):
    c = cfg(use_opd=True, opd_teacher_load="unused", opd_kl_coef=0.5, calculate_per_token_loss=True)
    teacher = ModelTeacher(lm(seed=7), c.rollout.rollout_temperature, 3)
    trainer = TorchTrainer(lm(), c, pad_id=PAD, teacher=teacher)
    rollout_metrics, steps = trainer.train_rollout(samples, [s.reward for s in samples], 0)
    assert abs(rollout_metrics["rollout/opd_reverse_kl"]) > 0.01  # a different random teacher
    # one on-policy step, token-mean reduction: the actor's R(logp - teacher) is the rollout's token mean
    assert steps[0]["train/opd_reverse_kl"] == pytest.approx(rollout_metrics["rollout/opd_reverse_kl"], abs=1e-5)


def test_opd_without_teacher_reads_the_samples(lm, cfg, sample_factory):
    c = cfg(use_opd=True, opd_type="sglang")
    trainer = TorchTrainer(lm(), c, pad_id=PAD)
    with_teacher = sample_factory(with_teacher=True)  # teacher log-prob -1.0 on every token
    rollout_metrics, steps = trainer.train_rollout(with_teacher, [s.reward for s in with_teacher], 0)
    assert "train/opd_reverse_kl" in steps[0]
    assert rollout_metrics["rollout/opd_reverse_kl"] == pytest.approx(rollout_metrics["rollout/log_probs"] + 1.0, abs=1e-5)
    with pytest.raises(ValueError, match="teacher_log_probs .*set opd_teacher_load"):  # names the field that fixes it
        trainer.train_rollout(sample_factory(), [0.0] * 8, 1)


def test_load_teacher(cfg, tmp_path, lm):
    assert load_teacher(cfg(), torch.float32, 48) is None  # no OPD
    assert load_teacher(cfg(use_opd=True, opd_type="sglang"), torch.float32, 48) is None  # samples carry them
    lm(vocab=48).save_pretrained(tmp_path / "t48")
    t = load_teacher(cfg(use_opd=True, opd_teacher_load=str(tmp_path / "t48")), torch.float32, 48)
    assert isinstance(t, ModelTeacher)
    e = load_teacher(cfg(use_opd=True, opd_type="sglang", opd_teacher_load=str(tmp_path / "t48")), torch.float32, 48,
                     make_engine=ScoringEngine)
    assert isinstance(e, EngineTeacher) and isinstance(e.engine, ScoringEngine)
    with pytest.raises(ValueError, match="vocab_size"):
        load_teacher(cfg(use_opd=True, opd_teacher_load=str(tmp_path / "t48")), torch.float32, 64)

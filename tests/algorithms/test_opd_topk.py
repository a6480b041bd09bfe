"""Top-k OPD (algorithms/opd.py): the estimate against a computation written here from the formula (the
reference's on_policy_distillation._compute_topk_reverse_kl), the vectorised and per-position forms agree, the
strategies and weight modes differ where their token sets and weights do, and compute_advantages applies it."""

from __future__ import annotations

import math

import pytest
import torch

from miles_core.algorithms import AdvantageInputs, compute_advantages
from miles_core.algorithms.opd import REWARD_WEIGHT_MODES, TOP_K_STRATEGIES, topk_position_kl, topk_reverse_kl
from miles_core.config.algo import AlgoConfig


def by_hand(s: list[float], t: list[float], k: int, strategy: str, mode: str) -> float:
    """One position from the formula: s, t the student's and teacher's log-probs over the whole vocabulary."""
    top = lambda lp: set(sorted(range(len(lp)), key=lambda i: -lp[i])[:k])  # noqa: E731
    S, T = top(s), top(t)
    chosen = {"only-student": S, "only-teacher": T, "intersection": S & T, "union": S | T, "xor": S ^ T}[strategy]
    if not chosen:
        return 0.0
    raw = {i: math.exp({"student_p": s[i], "teacher_p": t[i], "none": 0.0}[mode]) for i in chosen}
    total = 1.0 if strategy == "xor" else sum(raw.values())  # xor: weights not normalised
    return sum(raw[i] / total * (s[i] - t[i]) for i in chosen)


def distributions(seed: int, shape=(2, 3, 10)):
    g = torch.Generator().manual_seed(seed)
    student = torch.log_softmax(torch.randn(shape, generator=g) * 2, -1)
    teacher = torch.log_softmax(torch.randn(shape, generator=g) * 2, -1)
    return student.double(), teacher.double()


@pytest.mark.parametrize("strategy", TOP_K_STRATEGIES)
@pytest.mark.parametrize("mode", REWARD_WEIGHT_MODES)
def test_topk_reverse_kl_is_the_formula(strategy, mode):
    student, teacher = distributions(1)
    k = 3
    got = topk_reverse_kl(student, teacher, k, strategy, mode)  # [2, 3]
    for n in range(2):
        for j in range(3):
            s, t = student[n, j].tolist(), teacher[n, j].tolist()
            expect = by_hand(s, t, k, strategy, mode)
            assert float(got[n, j]) == pytest.approx(expect, abs=1e-9)
            # the per-position form (an HTTP teacher's top-k lists) gives the same number
            s_ids = sorted(range(10), key=lambda i: -s[i])[:k]
            t_ids = sorted(range(10), key=lambda i: -t[i])[:k]
            per = topk_position_kl(strategy, mode, s_ids, t_ids, dict(enumerate(s)), dict(enumerate(t)))
            assert per == pytest.approx(expect, abs=1e-9)


def test_strategies_and_modes_differ():
    student, teacher = distributions(2, (1, 8, 12))
    by_strategy = {st: topk_reverse_kl(student, teacher, 4, st, "student_p") for st in TOP_K_STRATEGIES}
    names = list(by_strategy)
    for a in range(len(names)):
        for b in range(a + 1, len(names)):
            assert not torch.allclose(by_strategy[names[a]], by_strategy[names[b]]), (names[a], names[b])
    by_mode = [topk_reverse_kl(student, teacher, 4, "union", m) for m in REWARD_WEIGHT_MODES]
    assert not torch.allclose(by_mode[0], by_mode[1]) and not torch.allclose(by_mode[1], by_mode[2])


def test_disjoint_top_sets():
    # student's top-2 {0, 1}, teacher's top-2 {2, 3}: no intersection (kl 0); xor == union's unnormalised sum
    s = torch.log_softmax(torch.tensor([[[5.0, 4.0, 0.0, 0.0, -1.0]]], dtype=torch.float64), -1)
    t = torch.log_softmax(torch.tensor([[[0.0, 0.0, 5.0, 4.0, -1.0]]], dtype=torch.float64), -1)
    assert float(topk_reverse_kl(s, t, 2, "intersection", "student_p")) == 0.0
    xor = float(topk_reverse_kl(s, t, 2, "xor", "none"))  # weights 1: the plain sum of the four differences
    assert xor == pytest.approx(float((s - t)[0, 0, :4].sum()), abs=1e-12)
    assert topk_position_kl("intersection", "none", [0, 1], [2, 3], {}, {}) == 0.0


def test_compute_advantages_uses_the_top_k_estimate():
    algo = AlgoConfig(use_opd=True, opd_kl_coef=0.5, advantage_estimator="grpo")
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    kl = torch.tensor([[0.2, -0.4, 9.0], [1.0, 9.0, 9.0]])  # padding values are masked out
    inputs = AdvantageInputs(rewards=torch.tensor([1.0, 0.0]), group_index=torch.tensor([0, 0]), loss_mask=mask,
                             old_log_probs=torch.zeros(2, 3), teacher_log_probs=torch.full((2, 3), -5.0),
                             opd_reverse_kl=kl)
    adv, _, metrics = compute_advantages(algo, inputs)
    base, _, _ = compute_advantages(AlgoConfig(advantage_estimator="grpo"), inputs)
    # the precomputed estimate wins over logp_old - logp_teacher (which would be +5 everywhere)
    torch.testing.assert_close(adv, (base - 0.5 * kl) * mask)
    assert metrics["opd_reverse_kl"] == pytest.approx((0.2 - 0.4 + 1.0) / 3)

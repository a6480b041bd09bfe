"""Advantage estimators: hand values, loop-vs-vectorised, grouping by group_index, the table, OPD, whitening."""

from __future__ import annotations

import math
import typing

import pytest
import torch

from miles_core.algorithms import ADVANTAGE_ESTIMATORS, AdvantageInputs, compute_advantages, kl_estimate
from miles_core.config.algo import AdvantageEstimator, AlgoConfig


def _inputs(rewards, group_index, mask, old=None, **kw) -> AdvantageInputs:
    mask = torch.tensor(mask, dtype=torch.float32)
    old = torch.zeros_like(mask) if old is None else torch.tensor(old)
    kw = {k: torch.tensor(v) for k, v in kw.items()}
    return AdvantageInputs(torch.tensor(rewards), torch.tensor(group_index), mask, old, **kw)


def test_table_matches_config_choices():
    assert sorted(ADVANTAGE_ESTIMATORS) == sorted(typing.get_args(AdvantageEstimator))


# groups by group_index, positions shuffled: g1 at 0, 2, 4 (rewards 1, 0, 2); g0 at 1, 3 (2, 4); g2 alone at 5 (5)
GRPO = _inputs([1.0, 2.0, 0.0, 4.0, 2.0, 5.0], [1, 0, 1, 0, 1, 2], [[1, 1, 0]] * 6)


def test_grpo_hand_values():
    adv, returns, metrics = compute_advantages(AlgoConfig(), GRPO)
    # g1: mean 1, unbiased var (0 + 1 + 1)/2 = 1 -> (r - 1)/(1 + 1e-6) = 0, -0.999999, 0.999999
    # g0: mean 3, unbiased var (1 + 1)/1 = 2 -> -+1/(sqrt 2 + 1e-6) = -+0.70710628
    # g2: one sample -> centered 0, never divided
    s2 = 1 / (math.sqrt(2) + 1e-6)
    expected = [0.0, -s2, -1 / (1 + 1e-6), s2, 1 / (1 + 1e-6), 0.0]
    assert returns is None
    assert adv[:, 0].tolist() == pytest.approx(expected, abs=1e-7)
    assert adv[:, 1].tolist() == pytest.approx(expected, abs=1e-7)  # every response token gets r'
    assert adv[:, 2].abs().sum() == 0  # masked out
    assert metrics["zero_std_groups"] == 1.0  # the singleton group


def test_grpo_zero_std_group_is_not_divided():
    inputs = _inputs([3.0, 3.0, 1.0, 0.0], [7, 7, 9, 9], [[1]] * 4)
    adv, _, metrics = compute_advantages(AlgoConfig(), inputs)
    # g7: constant -> 0 (no division by 1e-6); g9: mean 0.5, std sqrt(0.5) -> +-0.5/(0.7071068 + 1e-6)
    v = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert adv[:, 0].tolist() == pytest.approx([0.0, 0.0, v, -v], abs=1e-7)
    assert metrics["zero_std_groups"] == 1.0


def test_grpo_flags_and_gspo():
    dr, _, _ = compute_advantages(AlgoConfig(disable_grpo_std_normalization=True), GRPO)
    assert dr[:, 0].tolist() == pytest.approx([0.0, -1.0, -1.0, 1.0, 1.0, 0.0])  # centered only
    raw, _, _ = compute_advantages(AlgoConfig(disable_rewards_normalization=True), GRPO)
    assert raw[:, 0].tolist() == pytest.approx([1.0, 2.0, 0.0, 4.0, 2.0, 5.0])
    grpo, _, _ = compute_advantages(AlgoConfig(), GRPO)
    gspo, _, _ = compute_advantages(AlgoConfig(advantage_estimator="gspo"), GRPO)
    assert torch.equal(grpo, gspo)


def test_grpo_loop_vs_vectorised(make):
    b = make(n=12, t=5, seed=3, group_size=3)
    adv, _, _ = compute_advantages(AlgoConfig(), AdvantageInputs(b.rewards, b.group_index, b.mask, b.old))
    for i in range(12):
        group = [b.rewards[j].item() for j in range(12) if b.group_index[j] == b.group_index[i]]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (len(group) - 1)) if len(group) > 1 else 0.0
        value = b.rewards[i].item() - mean
        if std > 0:
            value /= std + 1e-6
        for t in range(5):
            assert adv[i, t].item() == pytest.approx(value * b.mask[i, t].item(), abs=1e-6)


def test_grouping_ignores_positions(make):
    b = make(n=8, t=4, seed=5)
    algo = AlgoConfig()
    adv, _, _ = compute_advantages(algo, AdvantageInputs(b.rewards, b.group_index, b.mask, b.old))
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    adv_p, _, _ = compute_advantages(algo, AdvantageInputs(b.rewards[perm], b.group_index[perm], b.mask[perm], b.old[perm]))
    assert torch.allclose(adv[perm], adv_p)


RPP = dict(
    rewards=[1.0, 2.0],
    group_index=[0, 0],
    mask=[[1, 1, 1, 0], [1, 0, 1, 1]],
    old=[[0.2, -0.4, 0.6, 9.0], [0.0, 0.0, 0.0, 0.0]],
    ref_log_probs=[[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]],
)


def test_reinforce_plus_plus_hand_values():
    algo = AlgoConfig(advantage_estimator="reinforce_plus_plus", kl_coef=0.1, gamma=0.5)
    adv, returns, metrics = compute_advantages(algo, _inputs(**RPP))
    # row 0: k1 kl = [0.2, -0.4, 0.6, (pad)]; token rewards -0.1*kl = [-0.02, 0.04, -0.06, 0], +1 at t=2
    #   A2 = 0.94; A1 = 0.04 + 0.5*0.94 = 0.51; A0 = -0.02 + 0.5*0.51 = 0.235; A3 = 0 (masked)
    # row 1: kl 0, hole at t=1, reward 2 at t=3: A3 = 2, A2 = 1, A1 = 0.5 -> masked to 0, A0 = 0.25
    assert returns is None
    assert adv[0].tolist() == pytest.approx([0.235, 0.51, 0.94, 0.0])
    assert adv[1].tolist() == pytest.approx([0.25, 0.0, 1.0, 2.0])
    assert metrics["reward_kl"] == pytest.approx((0.2 - 0.4 + 0.6) / 6)  # token mean over 6 masked tokens


def test_reinforce_plus_plus_baseline_hand_values():
    algo = AlgoConfig(advantage_estimator="reinforce_plus_plus_baseline", kl_coef=0.1)
    inputs = _inputs([1.0, 3.0], [4, 4], [[1, 1], [1, 0]], old=[[1.0, 2.0], [0.5, 7.0]], ref_log_probs=[[0.0, 0.0], [0.0, 0.0]])
    adv, _, _ = compute_advantages(algo, inputs)
    # r - mean = [-1, 1] (no std division); k1 kl = old - ref; A = (r' - 0.1 kl) * m
    assert adv.tolist() == [pytest.approx([-1.1, -1.2]), pytest.approx([0.95, 0.0])]
    raw, _, _ = compute_advantages(algo.model_copy(update={"disable_rewards_normalization": True}), inputs)
    assert raw.tolist() == [pytest.approx([0.9, 0.8]), pytest.approx([2.95, 0.0])]


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"])
def test_kl_coef_needs_ref(estimator):
    algo = AlgoConfig(advantage_estimator=estimator, kl_coef=0.1)
    inputs = _inputs([1.0], [0], [[1, 1]], values=[[0.0, 0.0]])
    with pytest.raises(ValueError, match="ref_log_probs"):
        compute_advantages(algo, inputs)


def test_ppo_gae_hand_values():
    algo = AlgoConfig(advantage_estimator="ppo", gamma=0.9, lambd=0.8)
    inputs = _inputs([1.0], [0], [[1, 1, 0]], values=[[0.5, 0.4, 7.0]])
    adv, returns, metrics = compute_advantages(algo, inputs)
    # V*m = [0.5, 0.4, 0]; token rewards [0, 1, 0] (terminal at the last trainable token t=1)
    # t=2: delta 0 -> A2 = 0; t=1: delta = 1 + 0.9*0 - 0.4 = 0.6 -> A1 = 0.6
    # t=0: delta = 0 + 0.9*0.4 - 0.5 = -0.14 -> A0 = -0.14 + 0.9*0.8*0.6 = 0.292; returns = A + V
    assert adv[0].tolist() == pytest.approx([0.292, 0.6, 0.0])
    assert returns[0].tolist() == pytest.approx([0.792, 1.0, 0.0])
    assert metrics["values"] == pytest.approx(0.45) and metrics["returns"] == pytest.approx(0.896)


def test_ppo_needs_values():
    with pytest.raises(ValueError, match="values"):
        compute_advantages(AlgoConfig(advantage_estimator="ppo"), _inputs([1.0], [0], [[1]]))


def _loop_token_rewards(b, i, kl_coef):
    t_len = b.mask.shape[1]
    kl = [kl_estimate(b.old, b.ref, "k1")[i, t].item() * b.mask[i, t].item() for t in range(t_len)]
    rewards = [-kl_coef * k for k in kl]
    last = max((t for t in range(t_len) if b.mask[i, t] > 0), default=None)
    if last is not None:
        rewards[last] += b.rewards[i].item()
    return rewards


def test_reinforce_plus_plus_loop_vs_vectorised(make):
    b = make(n=6, t=8, seed=7)
    algo = AlgoConfig(advantage_estimator="reinforce_plus_plus", kl_coef=0.05, gamma=0.9)
    adv, _, _ = compute_advantages(algo, AdvantageInputs(b.rewards, b.group_index, b.mask, b.old, b.ref))
    for i in range(6):
        rewards = _loop_token_rewards(b, i, 0.05)
        for t in range(8):
            ret = sum(0.9 ** (s - t) * rewards[s] for s in range(t, 8))
            assert adv[i, t].item() == pytest.approx(ret * b.mask[i, t].item(), abs=1e-5)


def test_ppo_loop_vs_vectorised(make):
    """The loop walks only the trainable positions of each sample (holes and padding skipped)."""
    b = make(n=6, t=8, seed=8)
    algo = AlgoConfig(advantage_estimator="ppo", kl_coef=0.05, gamma=0.95, lambd=0.7)
    adv, returns, _ = compute_advantages(algo, AdvantageInputs(b.rewards, b.group_index, b.mask, b.old, b.ref, b.values))
    assert (b.mask[:, 1:-1] == 0).logical_and(b.mask[:, 2:] > 0).any(), "the batch must have interior holes"
    for i in range(6):
        rewards = _loop_token_rewards(b, i, 0.05)
        trainable = [t for t in range(8) if b.mask[i, t] > 0]
        gae, next_value = 0.0, 0.0
        for t in reversed(trainable):
            value = b.values[i, t].item()
            gae = rewards[t] + 0.95 * next_value - value + 0.95 * 0.7 * gae
            next_value = value
            assert adv[i, t].item() == pytest.approx(gae, abs=1e-5)
            assert returns[i, t].item() == pytest.approx(gae + value, abs=1e-5)
        holes = [t for t in range(8) if t not in trainable]
        assert adv[i, holes].abs().sum() == 0 and returns[i, holes].abs().sum() == 0


def test_ppo_gae_skips_an_untrained_span():
    # mask [1, 0, 1], V [.5, .3, .2], reward 1, gamma 1, lambd .5 (issue 20's case):
    # t=2: delta = 1 + 0 - .2 = .8, A = .8;  t=0 (next trainable t'=2): delta = 0 + .2 - .5 = -.3,
    # A = -.3 + .5 * .8 = 0.1 (stepping through the hole with V=0 would give -0.2)
    algo = AlgoConfig(advantage_estimator="ppo", gamma=1.0, lambd=0.5)
    adv, returns, _ = compute_advantages(algo, _inputs([1.0], [0], [[1, 0, 1]], values=[[0.5, 0.3, 0.2]]))
    assert adv[0].tolist() == pytest.approx([0.1, 0.0, 0.8])
    assert returns[0].tolist() == pytest.approx([0.6, 0.0, 1.0])


def test_normalize_advantages_hand_values():
    algo = AlgoConfig(disable_rewards_normalization=True, normalize_advantages=True)
    inputs = _inputs([1.0, 3.0, 5.0], [0, 1, 2], [[1, 1], [1, 0], [0, 0]])
    adv, _, metrics = compute_advantages(algo, inputs)
    # raw A tokens: 1, 1, 3 -> mean 5/3, population var (4/9 + 4/9 + 16/9)/3 = 8/9; (A - 5/3)/sqrt(8/9 + 1e-8)
    s = math.sqrt(8 / 9 + 1e-8)
    assert adv.tolist() == [pytest.approx([-2 / 3 / s] * 2), pytest.approx([4 / 3 / s, 0.0]), [0.0, 0.0]]
    assert metrics["advantages"] == pytest.approx(0.0, abs=1e-6)


def test_normalize_advantages_loop(make):
    b = make(n=8, t=6, seed=9)
    algo = AlgoConfig(advantage_estimator="reinforce_plus_plus", normalize_advantages=True)
    raw, _, _ = compute_advantages(AlgoConfig(advantage_estimator="reinforce_plus_plus"), AdvantageInputs(b.rewards, b.group_index, b.mask, b.old))
    adv, _, _ = compute_advantages(algo, AdvantageInputs(b.rewards, b.group_index, b.mask, b.old))
    kept = [raw[i, t].item() for i in range(8) for t in range(6) if b.mask[i, t] > 0]
    mean = sum(kept) / len(kept)
    var = sum((x - mean) ** 2 for x in kept) / len(kept)
    for i in range(8):
        for t in range(6):
            expected = (raw[i, t].item() - mean) / math.sqrt(var + 1e-8) if b.mask[i, t] > 0 else 0.0
            assert adv[i, t].item() == pytest.approx(expected, abs=1e-5)


def test_opd_shifts_advantages_before_whitening():
    inputs = _inputs([1.0, 0.0], [0, 0], [[1, 1], [1, 0]], old=[[-1.0, -2.0], [-0.5, -9.0]], teacher_log_probs=[[-1.5, -1.0], [-0.5, 0.0]])
    adv, _, metrics = compute_advantages(AlgoConfig(use_opd=True, opd_kl_coef=0.5), inputs)
    # grpo: r' = +-0.5/(sqrt(0.5) + 1e-6) = +-0.7071058; old - teacher = [[0.5, -1.0], [0.0, (pad)]]
    # A = r' - 0.5 * (old - teacher) -> [[0.7071058 - 0.25, 0.7071058 + 0.5], [-0.7071058, 0]]
    v = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert adv.tolist() == [pytest.approx([v - 0.25, v + 0.5]), pytest.approx([-v, 0.0])]
    assert metrics["opd_reverse_kl"] == pytest.approx(-0.5 / 3)
    with pytest.raises(ValueError, match="teacher_log_probs"):
        compute_advantages(AlgoConfig(use_opd=True), _inputs([1.0], [0], [[1]]))
    whitened, _, _ = compute_advantages(AlgoConfig(use_opd=True, opd_kl_coef=0.5, normalize_advantages=True), inputs)
    # shift applied first, then whitened: tokens [v - 0.25, v + 0.5, -v] -> (x - mean) / sqrt(var + 1e-8)
    kept = [v - 0.25, v + 0.5, -v]
    mean = sum(kept) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in kept) / 3 + 1e-8)
    assert whitened[0].tolist() == pytest.approx([(kept[0] - mean) / std, (kept[1] - mean) / std], abs=1e-6)
    assert whitened[1].tolist() == pytest.approx([(kept[2] - mean) / std, 0.0], abs=1e-6)


@pytest.mark.parametrize("estimator", sorted(ADVANTAGE_ESTIMATORS))
def test_every_estimator_zero_on_masked_tokens(estimator, batch):
    algo = AlgoConfig(advantage_estimator=estimator, kl_coef=0.1, normalize_advantages=True, use_opd=True)
    inputs = AdvantageInputs(batch.rewards, batch.group_index, batch.mask, batch.old, batch.ref, batch.values, batch.teacher)
    adv, returns, metrics = compute_advantages(algo, inputs)
    assert adv.shape == batch.mask.shape and adv.dtype == torch.float32
    assert adv[batch.mask == 0].abs().sum() == 0
    assert (returns is not None) == (estimator == "ppo")
    assert all(isinstance(v, float) for v in metrics.values())

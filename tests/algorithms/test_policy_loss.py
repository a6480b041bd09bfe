"""Actor losses (PPO clip, dual clip, GSPO, entropy, KL loss, SFT, custom) and the value loss."""

from __future__ import annotations

import math
import sys
import types
import typing

import pytest
import torch

from miles_core.algorithms import LOSS_FUNCTIONS, LossInputs, Reducer, actor_loss, ppo_clip, value_loss
from miles_core.config.algo import AlgoConfig

LR = [math.log(1.5), math.log(0.5), math.log(0.5), math.log(1.5), math.log(4.0)]
ADV = [1.0, 1.0, -1.0, -1.0, -1.0]


def _one_row(log_ratio, advantages, mask=None):
    logp = torch.tensor([log_ratio], requires_grad=True)
    old = torch.zeros(1, len(log_ratio))
    mask = torch.ones(1, len(log_ratio)) if mask is None else torch.tensor([mask])
    return LossInputs(logp, old, torch.tensor([advantages]), mask)


def test_ppo_clip_hand_values():
    inputs = _one_row(LR, ADV)
    # ratio, A -> unclipped -rA, clipped -clip(r, 0.8, 1.2)A, L = max:
    # 1.5, +1 -> -1.5, -1.2 -> -1.2 (clipped larger)      0.5, +1 -> -0.5, -0.8 -> -0.5
    # 0.5, -1 ->  0.5,  0.8 ->  0.8 (clipped larger)      1.5, -1 ->  1.5,  1.2 ->  1.5
    # 4.0, -1 ->  4.0,  1.2 ->  4.0
    loss, metrics = ppo_clip(AlgoConfig(), inputs.log_probs, inputs.old_log_probs, inputs.advantages, inputs.loss_mask)
    assert loss[0].tolist() == pytest.approx([-1.2, -0.5, 0.8, 1.5, 4.0])
    assert metrics["pg_clipfrac"][0].tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert metrics["ppo_kl"][0].tolist() == pytest.approx([-x for x in LR])
    # eps_clip_high 0.28: token 0 clipped at 1.28 -> -1.28
    loss_high, _ = ppo_clip(AlgoConfig(eps_clip_high=0.28), inputs.log_probs, inputs.old_log_probs, inputs.advantages, inputs.loss_mask)
    assert loss_high[0, 0].item() == pytest.approx(-1.28)
    # dual clip c = 3: for A < 0, L = min(L, 3): token 4 -> 3, others unchanged
    loss_dual, _ = ppo_clip(AlgoConfig(eps_clip_c=3.0), inputs.log_probs, inputs.old_log_probs, inputs.advantages, inputs.loss_mask)
    assert loss_dual[0].tolist() == pytest.approx([-1.2, -0.5, 0.8, 1.5, 3.0])


def test_actor_loss_reduces_hand_values():
    reduce = Reducer(False, num_samples=1, num_tokens=5)
    loss, metrics = actor_loss(AlgoConfig(), _one_row(LR, ADV), reduce)
    # pg_loss = (-1.2 - 0.5 + 0.8 + 1.5 + 4.0)/5 = 0.92; clipfrac 2/5; ppo_kl = -log(1.5*.5*.5*1.5*4)/5 = -log(2.25)/5
    assert loss.item() == pytest.approx(0.92)
    assert metrics["pg_loss"].item() == pytest.approx(0.92)
    assert metrics["pg_clipfrac"].item() == pytest.approx(0.4)
    assert metrics["ppo_kl"].item() == pytest.approx(-math.log(2.25) / 5)
    loss_dual, _ = actor_loss(AlgoConfig(eps_clip_c=3.0), _one_row(LR, ADV), reduce)
    assert loss_dual.item() == pytest.approx(0.72)  # (-1.2 - 0.5 + 0.8 + 1.5 + 3)/5


def test_log_ratio_is_clamped():
    # log ratio 30 -> clamped to 20 (no overflow); A = -1 -> L = exp(20)
    loss, _ = ppo_clip(AlgoConfig(), torch.tensor([[30.0]]), torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1))
    assert loss.item() == pytest.approx(math.exp(20), rel=1e-5)


def test_gspo_uses_sequence_mean_ratio():
    algo = AlgoConfig(advantage_estimator="gspo")
    # masked mean of [log 2, 0, (pad 5.0)] = log(2)/2 -> ratio sqrt 2 = 1.4142 for every token; A = 1
    # -> max(-1.4142, -1.2) = -1.2 on both tokens, both clipped; ppo_kl = -log(2)/2 on every token
    inputs = _one_row([math.log(2.0), 0.0, 5.0], [1.0, 1.0, 0.0], mask=[1.0, 1.0, 0.0])
    loss, metrics = ppo_clip(algo, inputs.log_probs, inputs.old_log_probs, inputs.advantages, inputs.loss_mask)
    assert loss[0, :2].tolist() == pytest.approx([-1.2, -1.2])
    assert metrics["pg_clipfrac"][0, :2].tolist() == [1.0, 1.0]
    assert metrics["ppo_kl"][0, :2].tolist() == pytest.approx([-math.log(2) / 2] * 2)


def test_gspo_gradient_matches_sequence_objective():
    # log ratios [0.05, -0.05, 0.02, (pad 3.0)], A = 1: s = exp(0.02/3) inside the clip range,
    # loss = R(-s) = -s; d(-s)/dlogp_t = -s/3 on the 3 tokens, 0 on the padding
    inputs = _one_row([0.05, -0.05, 0.02, 3.0], [1.0, 1.0, 1.0, 0.0], mask=[1.0, 1.0, 1.0, 0.0])
    loss, _ = actor_loss(AlgoConfig(advantage_estimator="gspo"), inputs, Reducer(False, 1, 3))
    loss.backward()
    s = math.exp(0.02 / 3)
    assert loss.item() == pytest.approx(-s)
    assert inputs.log_probs.grad[0].tolist() == pytest.approx([-s / 3] * 3 + [0.0])


def _loop_ppo_clip(b, eps, eps_high, c, gspo):
    out = []
    n, t_len = b.mask.shape
    for i in range(n):
        row = []
        count = sum(b.mask[i, t].item() for t in range(t_len))
        seq = sum((b.logp[i, t].item() - b.old[i, t].item()) * b.mask[i, t].item() for t in range(t_len)) / max(count, 1)
        for t in range(t_len):
            lr = seq if gspo else b.logp[i, t].item() - b.old[i, t].item()
            ratio = math.exp(min(max(lr, -20), 20))
            a = b.advantages[i, t].item()
            loss = max(-ratio * a, -min(max(ratio, 1 - eps), 1 + eps_high) * a)
            if c is not None and a < 0:
                loss = min(loss, -c * a)
            row.append(loss)
        out.append(row)
    return out


@pytest.mark.parametrize("gspo", [False, True])
@pytest.mark.parametrize("dual", [None, 2.5])
def test_ppo_clip_loop_vs_vectorised(gspo, dual, make):
    b = make(n=6, t=9, seed=11, spread=0.4)
    algo = AlgoConfig(advantage_estimator="gspo" if gspo else "grpo", eps_clip=0.2, eps_clip_high=0.3, eps_clip_c=dual)
    loss, _ = ppo_clip(algo, b.logp, b.old, b.advantages, b.mask)
    expected = torch.tensor(_loop_ppo_clip(b, 0.2, 0.3, dual, gspo))
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)


def test_entropy_and_kl_terms_hand_values():
    inputs = _one_row([0.0, 0.0], [1.0, -1.0])
    inputs.entropy = torch.tensor([[0.5, 1.5]])
    inputs.ref_log_probs = torch.tensor([[-0.2, -0.4]])
    algo = AlgoConfig(entropy_coef=0.1, use_kl_loss=True, kl_loss_coef=0.5)
    loss, metrics = actor_loss(algo, inputs, Reducer(False, 1, 2))
    # pg: ratio 1 -> L = -A = [-1, 1] -> 0; entropy R = 1.0; k1 kl = logp - ref = [0.2, 0.4] -> R = 0.3
    # loss = 0 - 0.1 * 1.0 + 0.5 * 0.3 = 0.05
    assert metrics["entropy_loss"].item() == pytest.approx(1.0)
    assert metrics["kl_loss"].item() == pytest.approx(0.3)
    assert loss.item() == pytest.approx(0.05)
    assert metrics["loss"].item() == pytest.approx(0.05)
    loss.backward()
    # d/dlogp: pg -A_t/2 = [-0.5, 0.5]; kl 0.5 * 1/2 = 0.25 each -> [-0.25, 0.75]
    assert inputs.log_probs.grad[0].tolist() == pytest.approx([-0.25, 0.75])


def test_opd_reverse_kl_metric():
    inputs = _one_row([0.0, -1.0], [0.0, 0.0])
    inputs.teacher_log_probs = torch.tensor([[-0.5, -0.5]])
    _, metrics = actor_loss(AlgoConfig(), inputs, Reducer(False, 1, 2))
    assert metrics["opd_reverse_kl"].item() == pytest.approx((0.5 - 0.5) / 2)  # logp - teacher = [0.5, -0.5]


def test_missing_inputs_fail_clearly():
    with pytest.raises(ValueError, match="entropy"):
        actor_loss(AlgoConfig(entropy_coef=0.01), _one_row([0.0], [1.0]), Reducer(False, 1, 1))
    with pytest.raises(ValueError, match="ref_log_probs"):
        actor_loss(AlgoConfig(use_kl_loss=True), _one_row([0.0], [1.0]), Reducer(False, 1, 1))
    with pytest.raises(ValueError, match="rollout_log_probs"):
        actor_loss(AlgoConfig(use_tis=True), _one_row([0.0], [1.0]), Reducer(False, 1, 1))


def test_sft_loss_hand_value():
    inputs = _one_row([-1.0, -3.0, -100.0], [0.0, 0.0, 0.0], mask=[1.0, 1.0, 0.0])
    loss, metrics = actor_loss(AlgoConfig(loss_type="sft_loss"), inputs, Reducer(False, 2, 2))
    # -R(logp) = -((-1 - 3)/2)/2 samples = 1.0
    assert loss.item() == pytest.approx(1.0)
    assert sorted(metrics) == ["loss"]


def test_custom_loss_by_dotted_path(monkeypatch):
    def my_loss(algo, inputs, reduce):
        loss = reduce(inputs.log_probs.square(), inputs.loss_mask)
        return loss, {"loss": loss.detach(), "my_metric": loss.detach() * 2}

    module = types.ModuleType("my_custom_losses")
    module.my_loss = my_loss
    monkeypatch.setitem(sys.modules, "my_custom_losses", module)
    algo = AlgoConfig(loss_type="custom_loss", custom_loss_function_path="my_custom_losses.my_loss")
    loss, metrics = actor_loss(algo, _one_row([1.0, 3.0], [0.0, 0.0]), Reducer(False, 1, 2))
    assert loss.item() == pytest.approx(5.0)  # (1 + 9)/2
    assert metrics["my_metric"].item() == pytest.approx(10.0)
    with pytest.raises(ValueError, match="custom_loss_function_path"):
        actor_loss(AlgoConfig(loss_type="custom_loss"), _one_row([0.0], [0.0]), Reducer(False, 1, 1))
    with pytest.raises(ValueError, match="has no attribute .nope."):
        bad = algo.model_copy(update={"custom_loss_function_path": "my_custom_losses.nope"})
        actor_loss(bad, _one_row([0.0], [0.0]), Reducer(False, 1, 1))


def test_loss_table_matches_config_choices():
    choices = typing.get_args(AlgoConfig.model_fields["loss_type"].annotation)
    assert sorted([*LOSS_FUNCTIONS, "custom_loss"]) == sorted(choices)


def test_metric_names_snapshot(batch):
    full = LossInputs(batch.logp.clone().requires_grad_(), batch.old, batch.advantages, batch.mask, batch.entropy,
                      batch.rollout, batch.ref, batch.teacher)
    reduce = Reducer(False, 8, batch.mask.sum().item())
    _, metrics = actor_loss(AlgoConfig(use_kl_loss=True, use_tis=True), full, reduce)
    assert sorted(metrics) == [
        "entropy_loss", "ess_ratio", "kl_loss", "loss", "ois", "opd_reverse_kl", "pg_clipfrac", "pg_loss", "ppo_kl",
        "tis", "tis_abs", "tis_clipfrac", "train_rollout_kl", "train_rollout_logprob_abs_diff",
    ]
    bare = LossInputs(batch.logp, batch.old, batch.advantages, batch.mask)
    _, metrics = actor_loss(AlgoConfig(), bare, reduce)
    assert sorted(metrics) == ["entropy_loss", "ess_ratio", "loss", "pg_clipfrac", "pg_loss", "ppo_kl"]  # entropy 0: not given
    assert all(v.dim() == 0 and not v.requires_grad for v in metrics.values())


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("tis", [None, "vanilla", "mis"])
def test_micro_batches_sum_to_full_batch(per_token, tis, make):
    b = make(n=9, t=6, seed=13, spread=0.5)
    algo = AlgoConfig(calculate_per_token_loss=per_token, use_kl_loss=True, kl_loss_coef=0.1, entropy_coef=0.01,
                      custom_tis_function_path=tis)
    reduce = Reducer(per_token, num_samples=9, num_tokens=b.mask.sum().item())

    def run(rows):
        logp = b.logp[rows].clone().requires_grad_()
        inputs = LossInputs(logp, b.old[rows], b.advantages[rows], b.mask[rows], b.entropy[rows], b.rollout[rows], b.ref[rows])
        loss, metrics = actor_loss(algo, inputs, reduce)
        loss.backward()
        return loss.detach(), metrics, logp.grad

    full_loss, full_metrics, full_grad = run(slice(0, 9))
    parts = [run(slice(i, i + 3)) for i in range(0, 9, 3)]
    assert sum(p[0] for p in parts).item() == pytest.approx(full_loss.item(), rel=1e-5, abs=1e-7)
    torch.testing.assert_close(torch.cat([p[2] for p in parts]), full_grad)
    for name, value in full_metrics.items():  # ess_ratio too: a per-sample quantity, so additive
            assert sum(p[1][name] for p in parts).item() == pytest.approx(value.item(), rel=1e-5, abs=1e-6), name


def test_value_loss_hand_values():
    values = torch.tensor([[1.5, 0.9, 7.0]], requires_grad=True)
    old = torch.tensor([[1.0, 1.0, 0.0]])
    returns = torch.tensor([[2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = value_loss(AlgoConfig(value_clip=0.2), values, old, returns, mask, Reducer(False, 1, 2))
    # t0: clipped V = 1 + 0.2 = 1.2 -> (1.2 - 2)^2 = 0.64; unclipped (1.5 - 2)^2 = 0.25 -> 0.64, clipped (|0.5| > 0.2)
    # t1: clipped V = 0.9 -> 0.81 both -> 0.81, not clipped; mean (0.64 + 0.81)/2 = 0.725; clipfrac 1/2
    assert loss.item() == pytest.approx(0.725)
    assert metrics["critic-value_loss"].item() == pytest.approx(0.725)
    assert metrics["critic-value_clipfrac"].item() == pytest.approx(0.5)


def test_value_loss_loop(make):
    b = make(n=5, t=6, seed=17)
    returns = b.values + torch.randn(5, 6, generator=torch.Generator().manual_seed(1))
    new = b.values + 0.3 * torch.randn(5, 6, generator=torch.Generator().manual_seed(2))
    loss, _ = value_loss(AlgoConfig(value_clip=0.2), new, b.values, returns, b.mask, Reducer(True, 5, b.mask.sum().item()))
    total = 0.0
    for i in range(5):
        for t in range(6):
            v, vo, r = new[i, t].item(), b.values[i, t].item(), returns[i, t].item()
            clipped = vo + min(max(v - vo, -0.2), 0.2)
            total += max((clipped - r) ** 2, (v - r) ** 2) * b.mask[i, t].item()
    assert loss.item() == pytest.approx(total / b.mask.sum().item(), rel=1e-5)


def test_unbiased_kl_weights_each_kl_estimate_by_its_importance_ratio_in_the_graph():
    """The reference's --use-unbiased-kl: kl_t * exp(logp_t - logp_old_t), the ratio kept in the graph; low_var_kl
    clamps the weighted value, not the estimate."""
    from miles_core.algorithms.kl import kl_estimate

    inputs = _one_row([math.log(2.0), 0.0], [0.0, 0.0])  # old 0: ratios [2, 1]; A = 0: no pg gradient
    inputs.ref_log_probs = torch.tensor([[-0.2, -0.4]])
    algo = AlgoConfig(use_kl_loss=True, kl_loss_coef=0.5, use_unbiased_kl=True)
    loss, metrics = actor_loss(algo, inputs, Reducer(False, 1, 2))
    d = [math.log(2.0) + 0.2, 0.4]  # k1
    assert metrics["kl_loss"].item() == pytest.approx((2 * d[0] + d[1]) / 2)
    loss.backward()
    # d/dlogp of 0.5 * mean(r d) with r = exp(logp - old): 0.5 / 2 * r (d + 1)
    assert inputs.log_probs.grad[0].tolist() == pytest.approx([0.25 * 2 * (d[0] + 1), 0.25 * (d[1] + 1)])
    plain, _ = actor_loss(AlgoConfig(use_kl_loss=True, kl_loss_coef=0.5), _with_ref(), Reducer(False, 1, 2))
    assert plain.item() == pytest.approx(0.5 * sum(d) / 2) != pytest.approx(loss.item())  # without: the plain estimate
    logp, ref, half = torch.tensor([[0.0]]), torch.tensor([[3.0]]), torch.tensor([[0.5]])
    assert kl_estimate(logp, ref, "low_var_kl").item() == pytest.approx(10.0)  # exp(3) - 4 = 16.1, clamped
    assert kl_estimate(logp, ref, "low_var_kl", half).item() == pytest.approx(0.5 * (math.exp(3) - 4))  # 8.04: not clamped


def _with_ref():
    inputs = _one_row([math.log(2.0), 0.0], [0.0, 0.0])
    inputs.ref_log_probs = torch.tensor([[-0.2, -0.4]])
    return inputs


def test_opsm_masks_negative_advantage_sequences_that_moved_away():
    """use_opsm: a sample whose mean logp_old - logp exceeds opsm_delta loses its A < 0 tokens' pg loss
    (the reference's compute_opsm_mask); other samples and A >= 0 tokens keep theirs."""
    # row 0: logp - logp_old = [-0.5, -0.5] (seq_kl 0.5 > delta), A = [-1, +1] -> token 0 dropped
    # row 1: logp - logp_old = [0.5, 0.5] (seq_kl -0.5), A = [-1, -1] -> kept
    logp = torch.tensor([[-1.5, -1.5], [-0.5, -0.5]], requires_grad=True)
    old = torch.full((2, 2), -1.0)
    adv = torch.tensor([[-1.0, 1.0], [-1.0, -1.0]])
    inputs = LossInputs(logp, old, adv, torch.ones(2, 2))
    reduce = Reducer(False, num_samples=2, num_tokens=4)
    base_loss, base = actor_loss(AlgoConfig(), inputs, reduce)
    loss, metrics = actor_loss(AlgoConfig(use_opsm=True, opsm_delta=0.1), inputs, reduce)
    r = math.exp(-0.5)  # ratio of row 0; clipped to 0.8 for A = -1 -> L = max(r, 0.8) = 0.8; A = +1 -> -r
    # without OPSM row 0 = (0.8 - r)/2, with it (0 - r)/2; row 1 (ratio e^0.5, A = -1): L = e^0.5 for both tokens
    assert base["pg_loss"].item() == pytest.approx(((0.8 - r) / 2 + math.exp(0.5)) / 2, rel=1e-5)
    assert metrics["pg_loss"].item() == pytest.approx((-r / 2 + math.exp(0.5)) / 2, rel=1e-5)
    assert metrics["opsm_clipfrac"].item() == pytest.approx(0.5 / 2)  # row 0: 1 of 2 tokens, over 2 samples
    assert "opsm_clipfrac" not in base
    loss.backward()
    assert logp.grad[0, 0].item() == 0.0 and logp.grad[0, 1].item() != 0.0  # the dropped token has no gradient
    # a delta above the sequence KL masks nothing
    _, loose = actor_loss(AlgoConfig(use_opsm=True, opsm_delta=0.6), inputs, reduce)
    assert loose["pg_loss"].item() == pytest.approx(base["pg_loss"].item()) and loose["opsm_clipfrac"].item() == 0.0


def _dr_grpo_reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss=False):
    """The reference's example (examples/experimental/DrGRPO/custom_reducer.py): a constant divisor per sample."""
    seen.append((list(total_lengths), list(response_lengths), [m.tolist() for m in loss_masks], calculate_per_token_loss))
    return lambda x: sum((x_i * m_i).sum() / 10.0 for x_i, m_i in zip(x.split(response_lengths), loss_masks))


seen: list = []


def test_custom_pg_loss_reducer_reduces_the_pg_loss_only(monkeypatch):
    """custom_pg_loss_reducer_function_path: the user's factory gets the reference's arguments (per-sample lists) and
    reduces the flat pg of the micro-batch; the step divides its sum by the global batch size; the other metrics keep
    R. Row 0: 2 response tokens of 3 (padding after), row 1: 3; log ratio 0, so pg = -A on every token."""
    module = types.ModuleType("my_reducers")
    module.dr_grpo = _dr_grpo_reducer
    monkeypatch.setitem(sys.modules, "my_reducers", module)
    seen.clear()
    logp = torch.zeros(2, 3, requires_grad=True)
    adv = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    inputs = LossInputs(logp, torch.zeros(2, 3), adv, mask, response_lengths=[2, 3], total_lengths=[5, 7])
    reduce = Reducer(False, num_samples=4, num_tokens=4)
    _, base = actor_loss(AlgoConfig(), inputs, reduce)
    loss, metrics = actor_loss(AlgoConfig(custom_pg_loss_reducer_function_path="my_reducers.dr_grpo"), inputs, reduce)
    assert seen == [([5, 7], [2, 3], [[1.0, 1.0], [1.0, 0.0, 1.0]], False)]
    # default R: (-(1+2)/2 - (3+6)/2) / 4 = -1.5; the reducer: (-(1+2)/10 - (3+6)/10) / 4 = -0.3
    assert base["pg_loss"].item() == pytest.approx(-1.5) and metrics["pg_loss"].item() == pytest.approx(-0.3)
    assert metrics["loss"].item() == pytest.approx(-0.3)
    assert metrics["pg_clipfrac"].item() == base["pg_clipfrac"].item() and metrics["ppo_kl"].item() == base["ppo_kl"].item()
    loss.backward()  # d/dlogp of -A*ratio/10/4 at ratio 1: -A/40 on masked tokens, 0 on padding and masked-out ones
    assert torch.allclose(logp.grad, torch.tensor([[-1 / 40, -2 / 40, 0.0], [-3 / 40, 0.0, -6 / 40]]))
    # calculate_per_token_loss: the flag is passed on and the sum is divided by the step's token count (4)
    per_token = Reducer(True, num_samples=4, num_tokens=4)
    _, tok = actor_loss(AlgoConfig(custom_pg_loss_reducer_function_path="my_reducers.dr_grpo", calculate_per_token_loss=True),
                        inputs, per_token)
    assert seen[-1][3] is True and tok["pg_loss"].item() == pytest.approx(-(3 + 9) / 10 / 4)

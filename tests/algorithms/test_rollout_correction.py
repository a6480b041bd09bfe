"""Rollout/train mismatch metrics, vanilla TIS, MIS (modes, levels, rejection, veto, batch norm), custom TIS."""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path

import pytest
import torch

from miles_core.algorithms import LossInputs, MISConfig, Reducer, TISInputs, actor_loss, compute_mis_weights
from miles_core.algorithms.rollout_correction import (
    TIS_FUNCTIONS, load_options, mismatch_metrics, resolve_tis_function, rollout_correction,
)
from miles_core.config import ConfigError
from flows.recipes import load_config
from miles_core.config.algo import AlgoConfig

L3, LQ, L15 = math.log(3.0), math.log(0.25), math.log(1.5)
# two samples; row 1 has one padded position. d = old - rollout (rollout = 0):
# row 0: d = [log 3, log 0.25, 0] -> token weights [3, 0.25, 1]; row 1: d = [log 1.5, 0] -> [1.5, 1]
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
OLD = torch.tensor([[L3, LQ, 0.0], [L15, 0.0, 0.0]])
R2 = Reducer(False, num_samples=2, num_tokens=5)  # R = (row-0 token mean + row-1 token mean) / 2


def mis(old=OLD, mask=MASK, reduce=R2, **options):
    inputs = TISInputs(AlgoConfig(), old, torch.zeros_like(old), mask, reduce, options)
    weights, kept, metrics = compute_mis_weights(inputs)
    return weights, kept, {k: v.item() for k, v in metrics.items()}


def test_vanilla_tis_hand_values():
    logp = torch.zeros(1, 3, requires_grad=True)
    old = torch.zeros(1, 3)
    rollout = torch.tensor([[-L3, math.log(2.0), 0.0]])  # d = old - rollout = [log 3, log 0.5, 0] -> w = [3, 0.5, 1]
    inputs = LossInputs(logp, old, torch.ones(1, 3), torch.ones(1, 3), rollout_log_probs=rollout)
    loss, m = actor_loss(AlgoConfig(use_tis=True, tis_clip=2.0, tis_clip_low=0.6), inputs, Reducer(False, 1, 3))
    # clamp to [0.6, 2] -> [2, 0.6, 1]; ratio 1, A = 1 -> pg = -w = [-2, -0.6, -1] -> mean -1.2
    assert loss.item() == pytest.approx(-1.2)
    assert m["tis"].item() == pytest.approx(1.5)  # (3 + 0.5 + 1)/3 before the clamp
    assert m["tis_clipfrac"].item() == pytest.approx(2 / 3)
    assert m["tis_abs"].item() == pytest.approx(2.5 / 3)  # (2 + 0.5 + 0)/3
    assert m["ois"].item() == pytest.approx(1.0)


def test_get_mismatch_metrics_runs_vanilla_tis_as_the_reference():
    """The reference's policy_loss_function runs the TIS function under get_mismatch_metrics or use_tis: the same
    weighted loss and metrics as use_tis (hand values above); neither flag: no correction, no tis/ois."""
    logp = torch.zeros(1, 3, requires_grad=True)
    rollout = torch.tensor([[-L3, math.log(2.0), 0.0]])
    inputs = LossInputs(logp, torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3), rollout_log_probs=rollout)
    loss, m = actor_loss(AlgoConfig(get_mismatch_metrics=True, tis_clip=2.0, tis_clip_low=0.6), inputs, Reducer(False, 1, 3))
    assert loss.item() == pytest.approx(-1.2) and m["tis"].item() == pytest.approx(1.5) and m["ois"].item() == 1.0
    plain, m0 = actor_loss(AlgoConfig(tis_clip=2.0, tis_clip_low=0.6), inputs, Reducer(False, 1, 3))
    assert plain.item() == pytest.approx(-1.0) and "tis" not in m0 and "ois" not in m0
    with pytest.raises(ConfigError, match="get_mismatch_metrics with use_rollout_logprobs is not supported yet"):
        load_config("tiny", {"get_mismatch_metrics": True, "use_rollout_logprobs": True})


def test_mismatch_metrics_hand_values():
    old = torch.tensor([[math.log(2.0), 0.0, 5.0]])
    rollout = torch.zeros(1, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    m = mismatch_metrics(old, rollout, mask, Reducer(False, 1, 2))
    # |d| = [log 2, 0] -> log(2)/2; low_var_kl(rollout vs old): e^d - 1 - d = [2 - 1 - log 2, 0] -> (1 - log 2)/2
    assert m["train_rollout_logprob_abs_diff"].item() == pytest.approx(math.log(2) / 2)
    assert m["train_rollout_kl"].item() == pytest.approx((1 - math.log(2)) / 2)
    assert sorted(m) == ["train_rollout_kl", "train_rollout_logprob_abs_diff"]


def test_mis_mismatch_set_hand_values():
    old, rollout = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.5]])
    inputs = TISInputs(AlgoConfig(), old, rollout, torch.ones(1, 2), Reducer(False, 1, 2), {})
    m = {k: v.item() for k, v in compute_mis_weights(inputs)[2].items()}
    # d = [0.5, -0.5]; both log ppl = 1.5 -> ppl e^1.5, diff 0, ratio 1; mis_kl = mean(rollout - old) = 0
    # k3 = mean(e^d - 1 - d) = (0.1487213 + 0.1065307)/2; chi2_token = mean(e^{2d}) - 1 = (e + 1/e)/2 - 1
    # chi2_seq = e^{2 * sum d} - 1 = 0
    assert m["mis_training_log_ppl"] == pytest.approx(1.5) and m["mis_rollout_log_ppl"] == pytest.approx(1.5)
    assert m["mis_training_ppl"] == pytest.approx(math.exp(1.5)) and m["mis_rollout_ppl"] == pytest.approx(math.exp(1.5))
    assert m["mis_log_ppl_diff"] == pytest.approx(0.0) and m["mis_log_ppl_abs_diff"] == pytest.approx(0.0)
    assert m["mis_ppl_ratio"] == pytest.approx(1.0) and m["mis_kl"] == pytest.approx(0.0)
    assert m["mis_k3_kl"] == pytest.approx((math.exp(0.5) - 1.5 + math.exp(-0.5) - 0.5) / 2)
    assert m["mis_chi2_token"] == pytest.approx((math.e + 1 / math.e) / 2 - 1)
    assert m["mis_chi2_seq"] == pytest.approx(0.0, abs=1e-6)


def test_mis_token_truncate():
    w, kept, m = mis()
    # [3, .25, 1] -> [2, .25, 1]; [1.5, 1] unchanged; before = (4.25/3 + 2.5/2)/2; after = (3.25/3 + 1.25)/2
    assert w.tolist() == [pytest.approx([2.0, 0.25, 1.0]), pytest.approx([1.5, 1.0, 0.0])]
    assert torch.equal(kept, MASK)
    assert m["mis_tis_weight_before_bound"] == pytest.approx((4.25 / 3 + 1.25) / 2)
    assert m["mis_tis_weight_after_bound"] == pytest.approx((3.25 / 3 + 1.25) / 2)
    assert m["mis_tis_truncate_fraction"] == pytest.approx(1 / 6)  # (1/3 + 0)/2
    assert "mis_rs_catastrophic_token_fraction" not in m  # the veto is part of rejection sampling (use_rs)
    # per-sample min / max of the final weights, averaged over samples: (0.25 + 1)/2, (2 + 1.5)/2
    assert m["mis_is_ratio_min_final"] == pytest.approx(0.625)
    assert m["mis_is_ratio_max_final"] == pytest.approx(1.75)
    assert m["mis_is_ratio_mean_final"] == pytest.approx(m["mis_tis_weight_after_bound"])


def test_mis_token_clip():
    w, _, m = mis(tis_mode="clip")  # lower defaults to 1/2.0 = 0.5: [3, .25, 1] -> [2, .5, 1]
    assert w.tolist() == [pytest.approx([2.0, 0.5, 1.0]), pytest.approx([1.5, 1.0, 0.0])]
    assert m["mis_tis_clip_fraction_low"] == pytest.approx(1 / 6)
    assert m["mis_tis_clip_fraction_high"] == pytest.approx(1 / 6)
    w, _, m = mis(tis_mode="clip", tis_lower_bound=0.2, tis_upper_bound=4.0)  # nothing out of [0.2, 4]
    assert w[0].tolist() == pytest.approx([3.0, 0.25, 1.0]) and m["mis_tis_clip_fraction_low"] == 0.0


def test_mis_token_mask():
    w, kept, m = mis(tis_mode="mask")
    # tokens 3 (> 2) and 0.25 (< 0.5) leave the mask; weights elsewhere unchanged
    assert kept.tolist() == [[0.0, 0.0, 1.0], [1.0, 1.0, 0.0]]
    assert w.tolist() == [pytest.approx([0.0, 0.0, 1.0]), pytest.approx([1.5, 1.0, 0.0])]
    assert m["mis_tis_mask_fraction_low"] == pytest.approx(1 / 6)
    assert m["mis_tis_mask_fraction_high"] == pytest.approx(1 / 6)
    # the reference reduces over the original mask: the rejected tokens keep their weights 3 and .25
    assert m["mis_tis_weight_after_bound"] == pytest.approx((4.25 / 3 + 1.25) / 2)
    assert m["mis_is_ratio_mean_final"] == pytest.approx((4.25 / 3 + 1.25) / 2)
    assert m["mis_is_ratio_min_final"] == pytest.approx((0.25 + 1) / 2) and m["mis_is_ratio_max_final"] == pytest.approx(2.25)


def test_mis_sequence_and_geometric_levels():
    w, _, m = mis(tis_level="sequence")
    # row 0: exp(log 3 + log .25 + 0) = 0.75 on every token; row 1: 1.5
    assert w.tolist() == [pytest.approx([0.75] * 3), pytest.approx([1.5, 1.5, 0.0])]
    assert m["mis_tis_weight_before_bound"] == pytest.approx((0.75 + 1.5) / 2)
    w, _, _ = mis(tis_level="geometric")
    # row 0: exp(log(0.75)/3) = 0.9085603; row 1: exp(log(1.5)/2) = 1.2247449
    assert w.tolist() == [pytest.approx([0.75 ** (1 / 3)] * 3), pytest.approx([1.5**0.5] * 2 + [0.0])]
    old = torch.tensor([[L3, L3, 0.0], [L15, 0.0, 0.0]])  # row 0 sequence weight 9 > 2: the whole row leaves
    w, kept, m = mis(old=old, tis_level="sequence", tis_mode="mask")
    assert kept.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
    assert m["mis_tis_mask_fraction_high"] == pytest.approx(0.5)  # (3/3 + 0)/2


def test_mis_rejection_sampling():
    w, kept, m = mis(use_rs=True)  # token level, bounds default to the IS bounds [0.5, 2]
    assert kept.tolist() == [[0.0, 0.0, 1.0], [1.0, 1.0, 0.0]]
    assert m["mis_rs_mask_fraction_low"] == pytest.approx(1 / 6) and m["mis_rs_mask_fraction_high"] == pytest.approx(1 / 6)
    # the truncated weights [2, .25, 1], [1.5, 1] over the original mask (rejection changes the mask, not w)
    assert m["mis_is_ratio_mean_after_tis_rs"] == pytest.approx((3.25 / 3 + 1.25) / 2)
    assert w.tolist() == [pytest.approx([0.0, 0.0, 1.0]), pytest.approx([1.5, 1.0, 0.0])]
    _, kept, m = mis(use_rs=True, rs_level="sequence", rs_lower_bound=0.8)  # row 0: 0.75 < 0.8 -> rejected
    assert kept.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
    assert m["mis_rs_mask_fraction_low"] == pytest.approx(0.5) and m["mis_rs_mask_fraction_high"] == 0.0
    _, kept, _ = mis(use_rs=True, rs_lower_bound=0.0, rs_upper_bound=10.0)  # rs_lower 0 rejects nothing below
    assert torch.equal(kept, MASK)


def test_mis_veto_masks_the_whole_sequence():
    old = torch.tensor([[math.log(1e-5), 0.0, 0.0], [L15, 0.0, math.log(1e-9)]])  # row 1's tiny value is padding
    wide = dict(use_rs=True, rs_lower_bound=0.0, rs_upper_bound=10.0)  # rejection itself drops nothing
    w, kept, m = mis(old=old, **wide)
    assert kept.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
    assert w[0].abs().sum() == 0
    assert m["mis_rs_catastrophic_token_fraction"] == pytest.approx(1 / 6)  # (1/3 + 0)/2
    assert m["mis_rs_catastrophic_seq_fraction"] == pytest.approx(0.5)
    _, kept, m = mis(old=old, rs_veto_threshold=None, **wide)
    assert torch.equal(kept, MASK) and "mis_rs_catastrophic_seq_fraction" not in m
    # without use_rs there is no veto (the reference's truncate-only setups keep every sample)
    _, kept, m = mis(old=old)
    assert torch.equal(kept, MASK) and "mis_rs_catastrophic_seq_fraction" not in m


def test_mis_use_tis_false_logs_the_mismatch_set_only():
    w, kept, m = mis(use_tis=False, use_rs=True, tis_batch_normalize=True)
    assert torch.equal(w, torch.ones_like(MASK)) and torch.equal(kept, MASK)
    assert sorted(m) == sorted(k for k in m if not k.startswith(("mis_tis", "mis_rs", "mis_is", "mis_batch")))
    assert "mis_chi2_seq" in m and "mis_tis_weight_before_bound" not in m


def test_mis_batch_normalize():
    w, _, m = mis(tis_batch_normalize=True)
    # truncated token weights [2, .25, 1, 1.5, 1]: mean 5.75/5 = 1.15; share R(1) = 1 -> factor metric 1.15
    assert m["mis_batch_norm_factor"] == pytest.approx(1.15)
    assert w.tolist() == [pytest.approx([2 / 1.15, 0.25 / 1.15, 1 / 1.15]), pytest.approx([1.5 / 1.15, 1 / 1.15, 0.0])]
    assert m["mis_is_ratio_mean_final"] == pytest.approx((3.25 / 3 + 1.25) / 2 / 1.15)
    # sequence level: the mean is over samples (0.75 and 1.5 -> 1.125), not over tokens (1.05)
    w, _, m = mis(tis_level="sequence", tis_batch_normalize=True)
    assert m["mis_batch_norm_factor"] == pytest.approx(1.125)
    assert w[0, 0].item() == pytest.approx(0.75 / 1.125)
    with pytest.raises(ValueError, match="geometric"):
        mis(tis_level="geometric", tis_batch_normalize=True)


def test_mis_batch_normalize_over_the_original_mask():
    # mask mode drops 3 and .25; the reference still divides by the mean over all five original tokens:
    # [3, .25, 1, 1.5, 1] -> 6.75 / 5 = 1.35 (the kept tokens alone would give 3.5 / 3)
    w, kept, m = mis(tis_mode="mask", tis_batch_normalize=True)
    assert m["mis_batch_norm_factor"] == pytest.approx(1.35)
    assert w.tolist() == [pytest.approx([0.0, 0.0, 1 / 1.35]), pytest.approx([1.5 / 1.35, 1 / 1.35, 0.0])]
    assert m["mis_is_ratio_mean_final"] == pytest.approx((4.25 / 3 + 1.25) / 2 / 1.35)
    # a sample vetoed by rejection still counts in the token mean
    _, _, m = mis(old=torch.tensor([[math.log(1e-5), 0.0, 0.0], [L15, 0.0, 0.0]]), use_rs=True, rs_lower_bound=0.0,
                  rs_upper_bound=10.0, tis_batch_normalize=True)
    assert m["mis_batch_norm_factor"] == pytest.approx((1e-5 + 1 + 1 + 1.5 + 1) / 5)


def test_mis_metric_names_snapshot():
    common = [
        "mis_chi2_seq", "mis_chi2_token", "mis_is_ratio_max_final", "mis_is_ratio_mean_after_tis_rs",
        "mis_is_ratio_mean_final", "mis_is_ratio_min_final", "mis_k3_kl", "mis_kl", "mis_log_ppl_abs_diff",
        "mis_log_ppl_diff", "mis_ppl_ratio", "mis_rollout_log_ppl", "mis_rollout_ppl", "mis_tis_weight_after_bound",
        "mis_tis_weight_before_bound", "mis_training_log_ppl", "mis_training_ppl",
    ]
    veto = ["mis_rs_catastrophic_seq_fraction", "mis_rs_catastrophic_token_fraction"]
    assert sorted(mis(rs_veto_threshold=None)[2]) == sorted([*common, "mis_tis_truncate_fraction"])
    assert sorted(mis()[2]) == sorted([*common, "mis_tis_truncate_fraction"])
    assert sorted(mis(tis_mode="clip", use_rs=True, tis_batch_normalize=True)[2]) == sorted([
        *common, *veto, "mis_tis_clip_fraction_low", "mis_tis_clip_fraction_high", "mis_rs_mask_fraction_low",
        "mis_rs_mask_fraction_high", "mis_batch_norm_factor",
    ])
    assert sorted(mis(tis_mode="mask")[2]) == sorted([*common, "mis_tis_mask_fraction_low", "mis_tis_mask_fraction_high"])


def _loop_level(d, mask, i, level):
    kept = [d[i][t] for t in range(len(d[i])) if mask[i][t] > 0]
    if level == "sequence":
        return [sum(kept)] * len(d[i])
    if level == "geometric":
        return [sum(kept) / max(len(kept), 1)] * len(d[i])
    return list(d[i])


def _loop_mis(old, rollout, mask, cfg: MISConfig):
    """Plain python MIS: -> (weights, kept) as nested lists."""
    n, t_len = len(mask), len(mask[0])
    d = [[(old[i][t] - rollout[i][t]) if mask[i][t] > 0 else 0.0 for t in range(t_len)] for i in range(n)]
    weights, kept = [], []
    for i in range(n):
        w = [math.exp(min(max(x, -20), 20)) for x in _loop_level(d, mask, i, cfg.tis_level)]
        keep = [mask[i][t] for t in range(t_len)]
        for t in range(t_len):
            low, high = w[t] < cfg.lower, w[t] > cfg.tis_upper_bound
            if cfg.tis_mode == "truncate":
                w[t] = min(w[t], cfg.tis_upper_bound)
            elif cfg.tis_mode == "clip":
                w[t] = min(max(w[t], cfg.lower), cfg.tis_upper_bound)
            elif low or high:
                keep[t] = 0.0
        if cfg.use_rs:
            rs = [math.exp(min(max(x, -20), 20)) for x in _loop_level(d, mask, i, cfg.rs_level)]
            keep = [0.0 if (rs[t] < cfg.rs_lower or rs[t] > cfg.rs_upper) else keep[t] for t in range(t_len)]
            if any(mask[i][t] > 0 and d[i][t] < math.log(cfg.rs_veto_threshold) for t in range(t_len)):
                keep = [0.0] * t_len
        weights.append(w)
        kept.append(keep)
    return weights, kept


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("mode", ["truncate", "clip", "mask"])
def test_mis_loop_vs_vectorised(level, mode, make):
    b = make(n=10, t=6, seed=21, spread=0.8)
    options = dict(tis_level=level, tis_mode=mode, use_rs=True, rs_level="geometric", rs_upper_bound=1.6,
                   rs_veto_threshold=0.1, tis_upper_bound=1.8)
    reduce = Reducer(False, 10, b.mask.sum().item())
    inputs = TISInputs(AlgoConfig(), b.old, b.rollout, b.mask, reduce, options)
    weights, kept, metrics = compute_mis_weights(inputs)
    ref_w, ref_kept = _loop_mis(b.old.tolist(), b.rollout.tolist(), b.mask.tolist(), MISConfig(**options))
    assert kept.tolist() == ref_kept
    expected = torch.tensor(ref_w) * torch.tensor(ref_kept)
    torch.testing.assert_close(weights, expected, rtol=1e-5, atol=1e-6)
    assert 0 < kept.sum() < b.mask.sum()  # the case exercises rejection
    mean_final = sum(  # over the original mask, rejected tokens included (as the reference)
        sum(ref_w[i][t] for t in range(6) if b.mask[i, t] > 0) / max(b.mask[i].sum().item(), 1) for i in range(10)
    ) / 10
    assert metrics["mis_is_ratio_mean_final"].item() == pytest.approx(mean_final, rel=1e-5)


def test_mis_config_validation(tmp_path):
    with pytest.raises(ValueError, match="tis_lower_bound"):
        MISConfig(tis_lower_bound=3.0, tis_upper_bound=2.0)
    with pytest.raises(ValueError, match="unknown_knob"):
        MISConfig(unknown_knob=1)
    assert MISConfig().lower == 0.5 and MISConfig(tis_upper_bound=4.0).rs_lower == 0.25


def test_mis_through_actor_loss_with_yaml(tmp_path, batch):
    path = tmp_path / "mis.yaml"
    path.write_text("tis_mode: mask\ntis_level: token\ntis_upper_bound: 1.1\n")
    assert dict(load_options(str(path))) == {"tis_mode": "mask", "tis_level": "token", "tis_upper_bound": 1.1}
    reduce = Reducer(False, 8, batch.mask.sum().item())
    inputs = LossInputs(batch.logp.clone().requires_grad_(), batch.old, batch.advantages, batch.mask, rollout_log_probs=batch.rollout)
    by_name = AlgoConfig(custom_tis_function_path="mis", custom_config_path=str(path))
    by_path = by_name.model_copy(update={"custom_tis_function_path": "miles_core.algorithms.mis.compute_mis_weights"})
    loss_a, metrics_a = actor_loss(by_name, inputs, reduce)
    loss_b, _ = actor_loss(by_path, inputs, reduce)
    assert loss_a.item() == loss_b.item()
    assert metrics_a["mis_tis_mask_fraction_high"].item() > 0
    assert {"ois", "ess_ratio", "train_rollout_kl"} <= set(metrics_a) and "tis" not in metrics_a


def test_custom_tis_function_contract(monkeypatch):
    def double_and_drop_first(inputs: TISInputs):
        mask = inputs.loss_mask.clone()
        mask[:, 0] = 0
        return torch.full_like(mask, 2.0), mask, {"my_tis": inputs.reduce(mask, inputs.loss_mask)}

    module = types.ModuleType("my_tis_module")
    module.fn = double_and_drop_first
    monkeypatch.setitem(sys.modules, "my_tis_module", module)
    algo = AlgoConfig(custom_tis_function_path="my_tis_module.fn")
    assert resolve_tis_function(algo) is double_and_drop_first
    inputs = LossInputs(torch.zeros(1, 3, requires_grad=True), torch.zeros(1, 3), torch.tensor([[5.0, 1.0, 2.0]]),
                        torch.ones(1, 3), rollout_log_probs=torch.zeros(1, 3))
    loss, metrics = actor_loss(algo, inputs, Reducer(False, 1, 3))
    # ratio 1 -> pg = -A * 2 on the kept tokens 1, 2: (-2 - 4)/2 (the per-sample denominator follows the new mask)
    assert loss.item() == pytest.approx(-3.0)
    assert metrics["my_tis"].item() == pytest.approx(2 / 3)


def test_tis_table_and_errors():
    assert sorted(TIS_FUNCTIONS) == ["mis", "vanilla"]
    assert resolve_tis_function(AlgoConfig()) is None
    assert resolve_tis_function(AlgoConfig(use_tis=True)) is TIS_FUNCTIONS["vanilla"]
    with pytest.raises(ValueError, match=r"or one of \[.mis., .vanilla.\]"):
        resolve_tis_function(AlgoConfig(custom_tis_function_path="nope"))
    with pytest.raises(ValueError, match="cannot import"):
        resolve_tis_function(AlgoConfig(custom_tis_function_path="no_such_pkg.fn"))


def test_ess_ratio_edges():
    from miles_core.algorithms.rollout_correction import ess_ratio

    w = torch.tensor([[1.0, 4.0, 9.0]])
    # per sample: equal weights -> 1; [1, 4] -> 25 / (2 * 17); an empty mask -> 0 (as the reference)
    assert ess_ratio(torch.full((2, 3), 0.3), torch.ones(2, 3)).tolist() == pytest.approx([1.0, 1.0])
    assert ess_ratio(w, torch.tensor([[1.0, 1.0, 0.0]])).item() == pytest.approx(25 / 34)
    assert ess_ratio(w, torch.zeros(1, 3)).item() == 0.0


def _loop_ess(logp, old, mask, per_token):
    """The reference's definition: w = exp(logp - logp_old) per token, ESS per sample, a sample mean (or a
    token-weighted mean with calculate_per_token_loss)."""
    total, tokens = 0.0, 0.0
    for i in range(len(mask)):
        w = [math.exp(logp[i][t] - old[i][t]) for t in range(len(mask[i])) if mask[i][t] > 0]
        n = max(len(w), 1)
        ess = sum(w) ** 2 / (n * max(sum(x * x for x in w), 1e-8))
        total += ess * len(w) if per_token else ess
        tokens += len(w)
    return total / (tokens if per_token else len(mask))


@pytest.mark.parametrize("per_token", [False, True])
def test_ess_ratio_is_the_policy_ratio_per_sample(per_token, make):
    b = make(n=8, t=6, seed=4, spread=0.6)
    reduce = Reducer(per_token, 8, b.mask.sum().item())
    algo = AlgoConfig(calculate_per_token_loss=per_token)
    inputs = LossInputs(b.logp.clone().requires_grad_(), b.old, b.advantages, b.mask, rollout_log_probs=b.rollout)
    _, metrics = actor_loss(algo, inputs, reduce)
    expected = _loop_ess(b.logp.tolist(), b.old.tolist(), b.mask.tolist(), per_token)
    assert metrics["ess_ratio"].item() == pytest.approx(expected, rel=1e-5)
    # the rollout log-probs play no part (the old definition used exp(logp_old - logp_roll))
    shifted = LossInputs(inputs.log_probs, b.old, b.advantages, b.mask, rollout_log_probs=b.rollout + 1.0)
    assert actor_loss(algo, shifted, reduce)[1]["ess_ratio"].item() == pytest.approx(expected, rel=1e-5)
    # hand values: one sample, w = pi/pi_old = [2, 1] -> (2 + 1)^2 / (2 * (4 + 1)) = 0.9
    one = LossInputs(torch.tensor([[math.log(2.0), 0.0]], requires_grad=True), torch.zeros(1, 2), torch.ones(1, 2),
                     torch.ones(1, 2))
    assert actor_loss(AlgoConfig(), one, Reducer(False, 1, 2))[1]["ess_ratio"].item() == pytest.approx(0.9)


REFERENCE_MIS = Path(__file__).resolve().parents[1] / "fixtures" / "reference" / "mis.yaml"


def test_the_reference_mis_yaml_loads_unchanged(batch):
    cfg = load_config("tiny-mis", {"custom_config_path": str(REFERENCE_MIS)})
    options = load_options(cfg.algo.custom_config_path)
    assert options["use_tis"] is True and options["rs_level"] == "geometric" and options["tis_batch_normalize"] is True
    reduce = Reducer(False, 8, batch.mask.sum().item())
    inputs = TISInputs(cfg.algo, batch.old, batch.rollout, batch.mask, reduce, options)
    weights, kept, metrics = compute_mis_weights(inputs)
    assert {"mis_batch_norm_factor", "mis_rs_mask_fraction_low", "mis_rs_catastrophic_seq_fraction"} <= set(metrics)
    assert kept.sum() < batch.mask.sum()  # rs bounds [0.99, 1.001] at the geometric level reject most samples


def test_mis_knobs_are_checked_at_config_load(tmp_path):
    bad = tmp_path / "mis.yaml"
    bad.write_text("tis_mode: truncate\ntis_levle: token\n")
    with pytest.raises(ConfigError, match="tis_levle"):
        load_config("tiny-mis", {"custom_config_path": str(bad)})
    bad = tmp_path / "mis-geometric.yaml"  # load_options caches by path
    bad.write_text("tis_level: geometric\ntis_batch_normalize: true\n")
    with pytest.raises(ConfigError, match="geometric"):
        load_config("tiny-mis", {"custom_config_path": str(bad)})


def _reference_fixtures(monkeypatch):
    monkeypatch.syspath_prepend(str(REFERENCE_MIS.parent))


def test_a_reference_tis_function_by_keyword_arguments(monkeypatch, batch):
    _reference_fixtures(monkeypatch)
    algo = AlgoConfig(custom_tis_function_path="reference_style_rm.tis_func", tis_clip=1.3)
    reduce = Reducer(False, 8, batch.mask.sum().item())
    weights, kept, metrics = rollout_correction(algo, batch.old, batch.rollout, batch.mask, reduce)
    # loop: w = min(exp(old - rollout), 1.3) on each sample's first L_i tokens (L_i = 1 + last trainable position)
    for i in range(8):
        trainable = [t for t in range(batch.mask.shape[1]) if batch.mask[i, t] > 0]
        for t in range(batch.mask.shape[1]):
            inside = bool(trainable) and t <= trainable[-1]
            expected = min(math.exp(batch.old[i, t] - batch.rollout[i, t]), 1.3) if inside else 0.0
            assert weights[i, t].item() == pytest.approx(expected, rel=1e-5)
    assert torch.equal(kept, batch.mask)
    expected_metric = reduce(torch.exp(batch.old - batch.rollout).clamp(max=1.3), batch.mask)
    assert metrics["ref_tis_weight"].item() == pytest.approx(expected_metric.item(), rel=1e-5)


def test_a_reference_custom_loss_is_refused_naming_the_field(monkeypatch):
    from miles_core.algorithms.losses import resolve_loss

    _reference_fixtures(monkeypatch)
    algo = AlgoConfig(loss_type="custom_loss", custom_loss_function_path="reference_style_rm.custom_loss")
    with pytest.raises(ValueError, match="custom_loss_function_path.*not supported yet"):
        resolve_loss(algo)
    with pytest.raises(ConfigError, match="custom_loss_function_path.*not supported yet"):  # at config load
        load_config("tiny", {"loss_type": "custom_loss", "custom_loss_function_path": "reference_style_rm.custom_loss"})

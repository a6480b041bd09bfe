"""Masked importance sampling (MIS): bounded IS weights, rejection sampling and a veto against the
rollout/train mismatch (the reference system's train_infer_mismatch_helper; Yao et al. 2025, Liu et al.
2025 "When speed kills stability"). Selected with `custom_tis_function_path: mis` (or the dotted path
`miles_core.algorithms.mis.compute_mis_weights`); knobs from the YAML at `custom_config_path` (MISConfig).

With d_t = logp_old_t - logp_roll_t on the masked tokens, the log weight at a level is
    token: d_t     sequence: sum_s d_s (every token of the sample)     geometric: mean_s d_s
and w = exp(clamp(level(d), -20, 20)). Then, in order (as the reference's compute_mis_weights):
    0. use_tis false: only the mismatch metrics; weights 1, mask unchanged (the reference's metrics-only mode).
    1. IS bound (tis_level, tis_mode):  truncate w <- min(w, upper) | clip w <- clamp(w, lower, upper) |
       mask: tokens with w outside [lower, upper] leave the loss mask (w kept).   lower defaults to 1/upper.
    2. rejection (use_rs, rs_level): tokens whose rs-level weight is outside [rs_lower, rs_upper] leave the
       mask (bounds default to the IS bounds; rs_lower 0 rejects nothing below); then the veto, part of
       rejection sampling (only with use_rs; rs_veto_threshold null disables it): a sample with any masked
       token d_t < log(threshold) leaves the mask entirely.
    3. tis_batch_normalize: w <- w / mean(w) over the ORIGINALLY trainable tokens of this call (the
       micro-batch; rejected tokens included) at the token level, or the mean over all samples of each
       sample's masked mean at the sequence level; no change when the mean is <= 1e-8. Undefined at the
       geometric level (refused by MISConfig).
Returned: (w * kept [N, T], loss_mask * kept [N, T], metrics). Every metric reduces over the original mask
with R (so rejected tokens count), additive over micro-batches; a per-sample quantity q_i is reduced as R of
q_i on every token of sample i. mis_tis_weight_after_bound and mis_is_ratio_mean_after_tis_rs are both R(w)
after the bound (rejection changes the mask, not w, so they are equal, as in the reference);
mis_is_ratio_mean/min/max_final are R of each sample's masked mean / min / max final weight over its
original tokens (0 for a sample with none); mis_batch_norm_factor is weighted by R(1).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from miles_core.config.mis import MIS_NAMES, Level, MISConfig  # noqa: F401  (re-exported)

from .ops import broadcast_tokens, masked_mean, masked_sum
from .reducer import Reducer
from .tis import LOG_WEIGHT_BOUND, TISInputs, log_weights

NORMALIZE_EPS = 1e-8


def level_log_ratio(d: Tensor, mask: Tensor, level: str) -> Tensor:
    """Log weight of each token at `level` (see module docstring). d, mask [N, T] -> [N, T]."""
    if level == "token":
        return d
    per_sample = masked_sum(d, mask, dim=-1) if level == "sequence" else masked_mean(d, mask, dim=-1)  # [N]
    return broadcast_tokens(per_sample, d)  # [N, T]


def mismatch_set(d: Tensor, old: Tensor, rollout: Tensor, mask: Tensor, reduce: Reducer) -> dict[str, Tensor]:
    """mis_* perplexity / KL / chi-square metrics. All inputs [N, T]."""
    train_log_ppl, rollout_log_ppl = -masked_mean(old, mask, dim=-1), -masked_mean(rollout, mask, dim=-1)  # [N]
    log_ppl_diff = train_log_ppl - rollout_log_ppl  # [N] = mean(logp_roll) - mean(logp_old)
    d_safe = torch.clamp(d, -LOG_WEIGHT_BOUND, LOG_WEIGHT_BOUND)
    seq_log_ratio = torch.clamp(masked_sum(d, mask, dim=-1), -LOG_WEIGHT_BOUND, LOG_WEIGHT_BOUND)  # [N]
    per_sample = {
        "mis_training_log_ppl": train_log_ppl,
        "mis_training_ppl": torch.exp(train_log_ppl),
        "mis_rollout_log_ppl": rollout_log_ppl,
        "mis_rollout_ppl": torch.exp(rollout_log_ppl),
        "mis_log_ppl_diff": log_ppl_diff,
        "mis_log_ppl_abs_diff": log_ppl_diff.abs(),
        "mis_ppl_ratio": torch.exp(log_ppl_diff),
        "mis_chi2_token": masked_mean(torch.exp(2 * d_safe), mask, dim=-1) - 1,
        "mis_chi2_seq": torch.exp(2 * seq_log_ratio) - 1,
    }
    metrics = {name: reduce.per_sample(value, mask) for name, value in per_sample.items()}
    metrics["mis_kl"] = reduce(-d, mask)
    metrics["mis_k3_kl"] = reduce(torch.exp(d_safe) - 1 - d_safe, mask)
    return metrics


def bound_weights(w: Tensor, mask: Tensor, cfg: MISConfig, reduce: Reducer) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Step 1: -> (bounded w, keep [N, T] 0/1, metrics)."""
    low, high = (w < cfg.lower).to(mask.dtype), (w > cfg.tis_upper_bound).to(mask.dtype)
    keep = torch.ones_like(mask)
    if cfg.tis_mode == "truncate":
        return torch.clamp(w, max=cfg.tis_upper_bound), keep, {"mis_tis_truncate_fraction": reduce(high, mask)}
    if cfg.tis_mode == "clip":
        metrics = {"mis_tis_clip_fraction_low": reduce(low, mask), "mis_tis_clip_fraction_high": reduce(high, mask)}
        return torch.clamp(w, cfg.lower, cfg.tis_upper_bound), keep, metrics
    metrics = {"mis_tis_mask_fraction_low": reduce(low, mask), "mis_tis_mask_fraction_high": reduce(high, mask)}
    return w, keep * (1 - low) * (1 - high), metrics


def reject(d: Tensor, mask: Tensor, cfg: MISConfig, reduce: Reducer) -> tuple[Tensor, dict[str, Tensor]]:
    """Step 2 (use_rs only): rejection by the rs-level weight, then the veto -> (keep [N, T] 0/1, metrics)."""
    keep, metrics = torch.ones_like(mask), {}
    if not cfg.use_rs:
        return keep, metrics
    rs_log = level_log_ratio(d, mask, cfg.rs_level)
    low_log = -math.inf if cfg.rs_lower == 0 else math.log(cfg.rs_lower)
    low, high = (rs_log < low_log).to(mask.dtype), (rs_log > math.log(cfg.rs_upper)).to(mask.dtype)
    metrics |= {"mis_rs_mask_fraction_low": reduce(low, mask), "mis_rs_mask_fraction_high": reduce(high, mask)}
    keep = keep * (1 - low) * (1 - high)
    if cfg.rs_veto_threshold is not None:
        catastrophic = ((d < math.log(cfg.rs_veto_threshold)) & (mask > 0)).to(mask.dtype)  # [N, T]
        vetoed = catastrophic.amax(dim=-1)  # [N]
        metrics["mis_rs_catastrophic_token_fraction"] = reduce(catastrophic, mask)
        metrics["mis_rs_catastrophic_seq_fraction"] = reduce.per_sample(vetoed, mask)
        keep = keep * (1 - broadcast_tokens(vetoed, keep))
    return keep, metrics


def batch_normalize(w: Tensor, mask: Tensor, level: str) -> tuple[Tensor, Tensor]:
    """Step 3: -> (w / factor, factor); factor = mean weight over the original mask (token) or the mean over all
    samples of the per-sample masked means (sequence); 1 when it is <= 1e-8."""
    if level == "token":
        factor = masked_mean(w, mask)
    else:
        factor = masked_mean(w, mask, dim=-1).mean()  # every sample counts, an empty one with 0
    factor = torch.where(factor > NORMALIZE_EPS, factor, torch.ones_like(factor))
    return w / factor, factor


def final_stats(w: Tensor, mask: Tensor, reduce: Reducer) -> dict[str, Tensor]:
    """mis_is_ratio_mean/min/max_final over the original mask (see module docstring)."""
    has_tokens = mask.sum(dim=-1) > 0  # [N]
    minimum = torch.where(mask > 0, w, torch.full_like(w, math.inf)).amin(dim=-1)  # [N]
    maximum = torch.where(mask > 0, w, torch.full_like(w, -math.inf)).amax(dim=-1)  # [N]
    zero = torch.zeros_like(minimum)
    return {
        "mis_is_ratio_mean_final": reduce(w, mask),
        "mis_is_ratio_min_final": reduce.per_sample(torch.where(has_tokens, minimum, zero), mask),
        "mis_is_ratio_max_final": reduce.per_sample(torch.where(has_tokens, maximum, zero), mask),
    }


def compute_mis_weights(inputs: TISInputs) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """TIS function (tis.py signature): -> (weights [N, T], loss_mask [N, T], mis_* metrics)."""
    cfg = MISConfig(**inputs.options)
    mask, reduce = inputs.loss_mask, inputs.reduce
    d = torch.where(mask > 0, log_weights(inputs.old_log_probs, inputs.rollout_log_probs), 0.0)  # [N, T], 0 on padding
    metrics = mismatch_set(d, inputs.old_log_probs, inputs.rollout_log_probs, mask, reduce)
    if not cfg.use_tis:
        return torch.ones_like(mask), mask, metrics
    w = torch.exp(torch.clamp(level_log_ratio(d, mask, cfg.tis_level), -LOG_WEIGHT_BOUND, LOG_WEIGHT_BOUND))
    metrics["mis_tis_weight_before_bound"] = reduce(w, mask)
    w, keep_tis, bound_metrics = bound_weights(w, mask, cfg, reduce)
    metrics |= bound_metrics
    metrics["mis_tis_weight_after_bound"] = reduce(w, mask)
    keep_rs, rs_metrics = reject(d, mask, cfg, reduce)
    kept = mask * keep_tis * keep_rs  # [N, T]
    metrics |= rs_metrics
    metrics["mis_is_ratio_mean_after_tis_rs"] = reduce(w, mask)
    if cfg.tis_batch_normalize:
        w, factor = batch_normalize(w, mask, cfg.tis_level)
        metrics["mis_batch_norm_factor"] = factor * reduce.share(mask)
    metrics |= final_stats(w, mask, reduce)
    return w * kept, kept, metrics

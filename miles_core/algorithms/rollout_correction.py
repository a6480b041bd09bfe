"""Rollout/train mismatch: always-on metrics and the importance-sampling corrections (TIS, MIS, custom).

The rollout engine samples from pi_roll; the trainer computes pi_old for the same tokens. They differ
(kernels, precision, stale weights). With d_t = logp_old_t - logp_roll_t and w_t = exp(d_t):

Always, when rollout log-probs are given (original loss mask):
    train_rollout_logprob_abs_diff = R(|d|)
    train_rollout_kl               = R(low_var_kl(logp_roll vs logp_old))
                                   = R(clamp(e^{d'} - 1 - d', -10, 10)),  d' = clamp(d, -20, 20)
    ess_ratio = share * (sum_t w_t)^2 / (n * sum_t w_t^2)  over the n masked tokens of the micro-batch,
                w_t = exp(clamp(d_t, +-20)) the raw (unbounded) weights; share = R(1), so the trainer's sum over
                micro-batches is the share-weighted mean of the micro-batch ESS ratios (exact for one micro-batch).
                1 = on-policy, -> 1/n = one token dominates. ESS is not additive, hence the weighting.

Corrections (one module each, in the TIS_FUNCTIONS name table; signature in tis.py):
    "vanilla" (tis.vanilla_tis, chosen by `use_tis`), "mis" (mis.compute_mis_weights), or a dotted path
    in `custom_tis_function_path`; knobs come from the YAML at `custom_config_path` (inputs.options).
With any correction on, also ois = R(exp(clamp(logp - logp_old, +-20))) (the PPO ratio, detached).
A correction is active when `use_tis` is set or `custom_tis_function_path` is given.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping
from typing import Any

import torch
import yaml
from torch import Tensor

from miles_core.config.algo import AlgoConfig

from miles_core.resolve import resolve
from .kl import kl_estimate
from .mis import compute_mis_weights
from .reducer import Reducer
from .tis import LOG_WEIGHT_BOUND, TISFunction, TISInputs, log_weights, vanilla_tis

TIS_FUNCTIONS: dict[str, TISFunction] = {"vanilla": vanilla_tis, "mis": compute_mis_weights}


def mismatch_metrics(
    old_log_probs: Tensor, rollout_log_probs: Tensor, loss_mask: Tensor, reduce: Reducer
) -> dict[str, Tensor]:
    """train_rollout_logprob_abs_diff, train_rollout_kl, ess_ratio (see module docstring). Inputs [N, T]."""
    d = log_weights(old_log_probs, rollout_log_probs)  # [N, T]
    kl = kl_estimate(rollout_log_probs.detach(), old_log_probs.detach(), "low_var_kl")  # [N, T]
    weights = torch.exp(torch.clamp(d, -LOG_WEIGHT_BOUND, LOG_WEIGHT_BOUND))  # [N, T]
    return {
        "train_rollout_logprob_abs_diff": reduce(d.abs(), loss_mask),
        "train_rollout_kl": reduce(kl, loss_mask),
        "ess_ratio": ess_ratio(weights, loss_mask) * reduce.share(loss_mask),
    }


def ess_ratio(weights: Tensor, mask: Tensor) -> Tensor:
    """(sum w)^2 / (n * sum w^2) over the masked elements (n = mask.sum()); 1 when nothing is masked in."""
    denom = mask.sum() * (weights.square() * mask).sum()
    ratio = (weights * mask).sum().square() / denom.clamp(min=torch.finfo(weights.dtype).tiny)
    return torch.where(denom > 0, ratio, torch.ones_like(ratio))  # no host sync


@functools.lru_cache(maxsize=16)
def load_options(path: str | None) -> Mapping[str, Any]:
    """The YAML mapping at `custom_config_path` (read once per path), read-only; {} for None."""
    if path is None:
        return types.MappingProxyType({})
    with open(path, encoding="utf-8") as handle:
        data = yaml.safe_load(handle) or {}
    if not isinstance(data, dict):
        raise ValueError(f"custom_config_path={path!r}: expected a YAML mapping of settings, got {type(data).__name__}")
    return types.MappingProxyType(data)


def resolve_tis_function(algo: AlgoConfig) -> TISFunction | None:
    """The active correction: custom_tis_function_path, else vanilla TIS with use_tis, else None."""
    if algo.custom_tis_function_path is not None:
        return resolve(algo.custom_tis_function_path, TIS_FUNCTIONS, "custom_tis_function_path")
    return vanilla_tis if algo.use_tis else None


def rollout_correction(
    algo: AlgoConfig, old_log_probs: Tensor, rollout_log_probs: Tensor | None, loss_mask: Tensor, reduce: Reducer
) -> tuple[Tensor, Tensor, dict[str, Tensor]] | None:
    """Run the active correction -> (weights [N, T], loss mask [N, T], metrics), or None when none is active."""
    fn = resolve_tis_function(algo)
    if fn is None:
        return None
    if rollout_log_probs is None:
        raise ValueError(
            "use_tis / custom_tis_function_path need rollout_log_probs (the engine's per-token log-probs)"
        )
    options = load_options(algo.custom_config_path)
    inputs = TISInputs(algo, old_log_probs.detach(), rollout_log_probs.detach(), loss_mask, reduce, options)
    weights, mask, metrics = fn(inputs)
    return weights.detach(), mask, metrics

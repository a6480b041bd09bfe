"""Rollout/train mismatch: always-on metrics and the importance-sampling corrections (TIS, MIS, custom).

The rollout engine samples from pi_roll; the trainer computes pi_old for the same tokens. They differ
(kernels, precision, stale weights). With d_t = logp_old_t - logp_roll_t and w_t = exp(d_t):

Always, when rollout log-probs are given (original loss mask):
    train_rollout_logprob_abs_diff = R(|d|)
    train_rollout_kl               = R(low_var_kl(logp_roll vs logp_old))
                                   = R(clamp(e^{d'} - 1 - d', -10, 10)),  d' = clamp(d, -20, 20)
(ess_ratio, the effective sample size of the policy ratio, is a policy-loss metric: policy_ess_ratio below.)

Corrections (one module each, in the TIS_FUNCTIONS name table; signature in tis.py):
    "vanilla" (tis.vanilla_tis, chosen by `use_tis`), "mis" (mis.compute_mis_weights), or a dotted path
    in `custom_tis_function_path`; knobs come from the YAML at `custom_config_path` (inputs.options). A function
    written for the reference (keyword arguments, first parameter `args`) is adapted (reference_tis.py).
With any correction on, also ois = R(exp(clamp(logp - logp_old, +-20))) (the PPO ratio, detached).
A correction is active when `use_tis` or `get_mismatch_metrics` is set (vanilla TIS unless a function is named,
as the reference) or `custom_tis_function_path` is given.
"""

from __future__ import annotations

import torch
from torch import Tensor

from miles_core.config.algo import AlgoConfig
from miles_core.config.mis import load_options  # noqa: F401  (re-exported)
from miles_core.resolve import resolve, takes_reference_args

from . import reference_tis
from .kl import kl_estimate
from .mis import compute_mis_weights
from .ops import masked_sum
from .reducer import Reducer
from .tis import LOG_WEIGHT_BOUND, TISFunction, TISInputs, log_weights, vanilla_tis

TIS_FUNCTIONS: dict[str, TISFunction] = {"vanilla": vanilla_tis, "mis": compute_mis_weights}
ESS_EPS = 1e-8


def mismatch_metrics(
    old_log_probs: Tensor, rollout_log_probs: Tensor, loss_mask: Tensor, reduce: Reducer
) -> dict[str, Tensor]:
    """train_rollout_logprob_abs_diff, train_rollout_kl (see module docstring). Inputs [N, T]."""
    d = log_weights(old_log_probs, rollout_log_probs)  # [N, T]
    kl = kl_estimate(rollout_log_probs.detach(), old_log_probs.detach(), "low_var_kl")  # [N, T]
    return {"train_rollout_logprob_abs_diff": reduce(d.abs(), loss_mask), "train_rollout_kl": reduce(kl, loss_mask)}


def ess_ratio(weights: Tensor, mask: Tensor) -> Tensor:
    """Per-sample ESS ratio (sum_t w)^2 / (max(n, 1) * max(sum_t w^2, 1e-8)), n = sum_t m (as the reference;
    0 for a sample with no masked token). weights, mask [N, T] -> [N]."""
    sum_w = masked_sum(weights, mask, dim=-1)  # [N]
    sum_w2 = masked_sum(weights.square(), mask, dim=-1)  # [N]
    return sum_w.square() / (mask.sum(dim=-1).clamp(min=1.0) * sum_w2.clamp(min=ESS_EPS))


def policy_ess_ratio(ppo_kl: Tensor, loss_mask: Tensor, reduce: Reducer) -> Tensor:
    """train/ess_ratio as the reference: per-sample ESS of the policy ratio w = exp(clamp(-ppo_kl, +-20))
    (= pi/pi_old; the sequence ratio for gspo), reduced with R as a per-sample quantity. [N, T] -> scalar."""
    weights = torch.exp(torch.clamp(-ppo_kl.detach(), -LOG_WEIGHT_BOUND, LOG_WEIGHT_BOUND))  # [N, T]
    return reduce.per_sample(ess_ratio(weights, loss_mask), loss_mask)


def resolve_tis_function(algo: AlgoConfig) -> TISFunction | None:
    """The active correction: custom_tis_function_path, else vanilla TIS with use_tis or get_mismatch_metrics (the
    reference's policy_loss_function runs vanilla TIS under either flag), else None."""
    if algo.custom_tis_function_path is not None:
        fn = resolve(algo.custom_tis_function_path, TIS_FUNCTIONS, "custom_tis_function_path")
        return reference_tis.adapt(fn) if takes_reference_args(fn) else fn
    return vanilla_tis if algo.use_tis or algo.get_mismatch_metrics else None


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

"""Actor losses, one name table keyed by `loss_type`; every entry has the signature

    loss_fn(algo: AlgoConfig, inputs: LossInputs, reduce: Reducer) -> (scalar loss, metrics: dict[str, Tensor])

policy_loss:  Loss = R'(pg) - entropy_coef * R'(H) + kl_loss_coef * R'(kl(logp, logp_ref))      (use_kl_loss;
              use_unbiased_kl: kl weighted by exp(logp - logp_old), kl.py)
              pg = ppo_clip per-token loss (policy_loss.py), times the OPSM keep mask (use_opsm, opsm.py), then
              the rollout-correction weights when on;
              R' = R with the loss mask returned by the correction (R when no correction).
              custom_pg_loss_reducer_function_path: R'(pg) is replaced by the user's reducer (pg_reducer below);
              every other term and metric keeps R'.
sft_loss:     Loss = -R(logp)
custom_loss:  the callable at `custom_loss_function_path` (dotted path), same signature.

Metrics are detached scalars reduced with R (global denominators), named without the `train/` prefix:
loss, pg_loss, pg_clipfrac, ppo_kl, ess_ratio (policy_loss: the per-sample ESS of pi/pi_old over the original
mask, as the reference), entropy_loss (policy_loss: 0 when no entropy is given, which the trainers compute only
with entropy_coef > 0 or observe_training_entropy, as the reference), kl_loss (use_kl_loss),
opd_reverse_kl = R'(logp - logp_teacher) (teacher given; top-k OPD: R'(its estimate)), the correction's metrics and ois (correction on),
opsm_clipfrac (use_opsm),
and for every loss type train_rollout_logprob_abs_diff, train_rollout_kl (rollout and old log-probs given: not with
disable_compute_advantages_and_returns, whose loss gets no old log-probs, advantages, reference or teacher).
`use_rollout_logprobs`: the caller passes the engine log-probs as old_log_probs; nothing changes here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from miles_core.config.algo import AlgoConfig

from miles_core.resolve import resolve, takes_reference_args

from .kl import kl_estimate
from .opsm import opsm_keep
from .policy_loss import LOG_RATIO_BOUND, ppo_clip
from .reducer import Reducer
from .rollout_correction import mismatch_metrics, policy_ess_ratio, rollout_correction


@dataclass
class LossInputs:
    """One micro-batch. Per-token tensors [N, T], right-padded."""

    log_probs: Tensor  # [N, T] current policy (requires grad)
    old_log_probs: Tensor | None  # [N, T]; None with disable_compute_advantages_and_returns
    advantages: Tensor | None  # [N, T]; None with disable_compute_advantages_and_returns
    loss_mask: Tensor  # [N, T]
    entropy: Tensor | None = None  # [N, T] needed when entropy_coef > 0; logged whenever given
    rollout_log_probs: Tensor | None = None  # [N, T] engine log-probs (mismatch metrics, TIS/MIS)
    ref_log_probs: Tensor | None = None  # [N, T] (use_kl_loss)
    teacher_log_probs: Tensor | None = None  # [N, T] (opd_reverse_kl metric)
    opd_reverse_kl: Tensor | None = None  # [N, T] top-k OPD's estimate (opd_reverse_kl metric)
    response_lengths: list[int] | None = None  # [N] response tokens per row (custom_pg_loss_reducer_function_path)
    total_lengths: list[int] | None = None  # [N] prompt + response tokens per row (custom_pg_loss_reducer_function_path)


LossResult = tuple[Tensor, dict[str, Tensor]]
LossFunction = Callable[[AlgoConfig, LossInputs, Reducer], LossResult]


def _regularizers(algo: AlgoConfig, inputs: LossInputs, mask: Tensor, reduce: Reducer) -> LossResult:
    """-entropy_coef * R(H) + kl_loss_coef * R(kl) and their metrics (+ opd_reverse_kl)."""
    term, metrics = inputs.log_probs.new_zeros(()), {}
    if inputs.entropy is not None:
        entropy = reduce(inputs.entropy, mask)
        term = term - algo.entropy_coef * entropy
        metrics["entropy_loss"] = entropy.detach()
    elif algo.entropy_coef > 0:
        raise ValueError(f"entropy_coef={algo.entropy_coef} needs LossInputs.entropy (see entropy_from_logits)")
    else:
        metrics["entropy_loss"] = term.detach().new_zeros(())  # not computed (entropy_coef 0): 0, as the reference
    if algo.use_kl_loss:
        if inputs.ref_log_probs is None:
            raise ValueError("use_kl_loss needs LossInputs.ref_log_probs (load the reference model)")
        ratio = torch.exp(inputs.log_probs - inputs.old_log_probs) if algo.use_unbiased_kl else None  # in the graph
        kl = reduce(kl_estimate(inputs.log_probs, inputs.ref_log_probs, algo.kl_loss_type, ratio), mask)
        term = term + algo.kl_loss_coef * kl
        metrics["kl_loss"] = kl.detach()
    if inputs.teacher_log_probs is not None:
        metrics["opd_reverse_kl"] = reduce((inputs.log_probs - inputs.teacher_log_probs).detach(), mask)
    elif inputs.opd_reverse_kl is not None:
        metrics["opd_reverse_kl"] = reduce(inputs.opd_reverse_kl, mask)
    return term, metrics


def policy_loss(algo: AlgoConfig, inputs: LossInputs, reduce: Reducer) -> LossResult:
    """PPO-clip policy gradient with optional rollout correction, entropy bonus and KL loss."""
    pg, token_metrics = ppo_clip(algo, inputs.log_probs, inputs.old_log_probs, inputs.advantages, inputs.loss_mask)
    mask, metrics = inputs.loss_mask, {"ess_ratio": policy_ess_ratio(token_metrics["ppo_kl"], inputs.loss_mask, reduce)}
    if algo.use_opsm:
        keep, clipfrac = opsm_keep(inputs.log_probs, inputs.old_log_probs, inputs.advantages, inputs.loss_mask,
                                   algo.opsm_delta, reduce)
        pg, metrics["opsm_clipfrac"] = pg * keep, clipfrac
    correction = rollout_correction(algo, inputs.old_log_probs, inputs.rollout_log_probs, inputs.loss_mask, reduce)
    if correction is not None:
        weights, mask, correction_metrics = correction
        log_ratio = torch.clamp(inputs.log_probs.detach() - inputs.old_log_probs, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        metrics |= dict(correction_metrics, ois=reduce(torch.exp(log_ratio), inputs.loss_mask))
        pg = pg * weights
    pg_loss = pg_reducer(algo, inputs, mask, reduce)(pg)
    extra, reg_metrics = _regularizers(algo, inputs, mask, reduce)
    loss = pg_loss + extra
    metrics |= {name: reduce(value, mask) for name, value in token_metrics.items()}
    return loss, {"loss": loss.detach(), "pg_loss": pg_loss.detach(), **metrics, **reg_metrics}


def pg_reducer(algo: AlgoConfig, inputs: LossInputs, mask: Tensor, reduce: Reducer) -> Callable[[Tensor], Tensor]:
    """R'(pg), or with custom_pg_loss_reducer_function_path the user's reducer, called as the reference's
    policy_loss_function does: fn(total_lengths, response_lengths, loss_masks (per sample, [response_length] each),
    calculate_per_token_loss) -> reduce_mb(x), x the micro-batch's per-token pg with the samples' response tokens
    concatenated [sum response_lengths] -> the micro-batch's sum, which the reference's loss scaling then divides
    by the step's global batch size (token count with calculate_per_token_loss): Reducer.normalize."""
    path = algo.custom_pg_loss_reducer_function_path
    if path is None:
        return lambda pg: reduce(pg, mask)
    if inputs.response_lengths is None or inputs.total_lengths is None:
        raise ValueError("custom_pg_loss_reducer_function_path needs LossInputs.response_lengths and total_lengths")
    lengths = inputs.response_lengths
    masks = [mask[i, :n] for i, n in enumerate(lengths)]
    custom = resolve(path, None, "custom_pg_loss_reducer_function_path")(
        list(inputs.total_lengths), list(lengths), masks, algo.calculate_per_token_loss)
    return lambda pg: reduce.normalize(custom(torch.cat([pg[i, :n] for i, n in enumerate(lengths)])))


def sft_loss(algo: AlgoConfig, inputs: LossInputs, reduce: Reducer) -> LossResult:
    """-R(logp): supervised fine-tuning on the masked response tokens."""
    loss = -reduce(inputs.log_probs, inputs.loss_mask)
    metrics = {"loss": loss.detach()}
    if inputs.entropy is not None:
        metrics["entropy_loss"] = reduce(inputs.entropy.detach(), inputs.loss_mask)
    return loss, metrics


LOSS_FUNCTIONS: dict[str, LossFunction] = {"policy_loss": policy_loss, "sft_loss": sft_loss}


def resolve_loss(algo: AlgoConfig) -> LossFunction:
    """The loss function of `loss_type` (custom_loss -> `custom_loss_function_path`)."""
    if algo.loss_type != "custom_loss":
        return LOSS_FUNCTIONS[algo.loss_type]
    if algo.custom_loss_function_path is None:
        raise ValueError(
            "loss_type='custom_loss' needs custom_loss_function_path (a dotted path 'package.module.function')"
        )
    fn = resolve(algo.custom_loss_function_path, LOSS_FUNCTIONS, "custom_loss_function_path")
    if takes_reference_args(fn):
        raise ValueError(
            f"custom_loss_function_path={algo.custom_loss_function_path!r} is written for the reference system "
            "(args, batch, logits, sum_of_sample_mean): it reads Megatron's packed logits and the reference's own "
            "helpers, which this trainer does not have; not supported yet. Write fn(algo, inputs, reduce) -> "
            "(loss, metrics) (docs/guide/customization.md)"
        )
    return fn


def actor_loss(algo: AlgoConfig, inputs: LossInputs, reduce: Reducer) -> LossResult:
    """-> (scalar loss to backward, detached scalar metrics reduced with `reduce`; sum them over micro-batches)."""
    loss, metrics = resolve_loss(algo)(algo, inputs, reduce)
    if inputs.rollout_log_probs is not None and inputs.old_log_probs is not None:
        mismatch = mismatch_metrics(inputs.old_log_probs, inputs.rollout_log_probs, inputs.loss_mask, reduce)
        metrics = {**metrics, **mismatch}
    return loss, metrics

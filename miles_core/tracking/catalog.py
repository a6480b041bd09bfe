"""The metrics catalog: every metric name miles logs, its step axis, meaning and the option that emits it.

One registry, used three ways:

- the tracker checks every key it logs against it (``check_keys``; REFERENCE §7 names);
- ``docs/reference/metrics.md`` is generated from it (``python -m tools.docs generate``);
- a test scans the emitter modules and asserts the names they can emit equal the catalog.

A name is literal, or a template with ``<placeholders>`` for the parts known only at run time
(``rollout/dynamic_filter/drop_<reason>``, ``eval/<ds>-pass@<k>``); ``PLACEHOLDERS`` gives the
regex of each. Keys are checked before sanitizing (``pass@4``, not ``pass_4``).

Custom extension functions (a custom loss or TIS function) that return metrics of their own
register them at import time with ``register(Metric(...))``. ``MILES_METRICS_CHECK`` selects what
an uncatalogued key does: ``warn`` (default: a long run is never killed by a metric name) logs a
warning once per key, ``error`` raises ``UncataloguedMetricError`` (the test suite sets it, so a new
emitter without a catalog entry fails CI), ``off`` skips the check.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

ROLLOUT, TRAIN, EVAL = "rollout/step", "train/step", "eval/step"
AXES = (ROLLOUT, TRAIN, EVAL)
CHECK_ENV = "MILES_METRICS_CHECK"
PLACEHOLDERS: dict[str, str] = {
    "r": r"-?\d+(?:\.\d+)?",  # a reward rounded to 1 decimal, as a float: 0.0, 1.0, -1.0
    "k": r"\d+",  # pass@k: 1, 2, 4, ... up to the group size
    "reason": r"[A-Za-z0-9_.\-]+",  # a dynamic-sampling drop reason
    "ds": r"[A-Za-z0-9_.\-]+?",  # an eval dataset name (eval_prompt_data)
    "cat": r"[^/]+",
    "p": r"p(?:25|50|75|100)",  # a quarter of rollout_max_response_len (log_correct_samples)  # a reward category (log_reward_category): the reward dict's value
}
_PLACEHOLDER = re.compile(r"<([a-z_]+)>")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Metric:
    """One catalogued metric. ``name`` is literal or a template with ``<placeholders>``."""

    name: str
    axis: str  # one of AXES
    meaning: str
    when: str  # the option or condition that makes the code emit it
    source: str  # the module that emits it (repository path)

    def __post_init__(self) -> None:
        if self.axis not in AXES:
            raise ValueError(f"metric {self.name!r}: axis {self.axis!r} is not one of {AXES}")
        unknown = set(_PLACEHOLDER.findall(self.name)) - set(PLACEHOLDERS)
        if unknown:
            raise ValueError(f"metric {self.name!r}: unknown placeholders {sorted(unknown)}; known: {sorted(PLACEHOLDERS)}")

    @property
    def is_template(self) -> bool:
        return "<" in self.name

    @property
    def regex(self) -> re.Pattern[str]:
        return _compile(self.name)


@lru_cache(maxsize=None)
def _compile(template: str) -> re.Pattern[str]:
    parts, pos = [], 0
    for m in _PLACEHOLDER.finditer(template):
        parts += [re.escape(template[pos : m.start()]), f"(?:{PLACEHOLDERS[m.group(1)]})"]
        pos = m.end()
    parts.append(re.escape(template[pos:]))
    return re.compile("".join(parts) + r"\Z")


_RM = "miles_core/rollout/metrics.py"
_LOCAL = "miles_core/runtime/runtime.py"
_TRAINER = "miles_core/training/rl_step.py"
_PERF = "miles_core/training/perf.py"
_ADV = "miles_core/algorithms/advantages"
_LOSS = "miles_core/algorithms/losses.py"
_CORR = "miles_core/algorithms/rollout_correction.py"
_MIS = "miles_core/algorithms/mis.py"
_MIS_ON = "custom_tis_function_path: mis"
_EVAL = "miles_core/evaluation/core.py"
_POINT = "miles_core/evaluation/point.py"
_FULLY = "miles_core/rollout/fully_async.py"
_MT = "miles_core/rollout/multi_turn/metrics.py"

CATALOG: tuple[Metric, ...] = (
    # ---- step axes (logged as metrics too, so every chart can use them as x) ----------------------
    Metric(ROLLOUT, ROLLOUT, "the rollout id (0-based)", "always", "flows/train.py"),
    Metric(TRAIN, TRAIN, "optimizer step: rollout_id * num_steps_per_rollout + step", "always", "flows/train.py"),
    Metric(EVAL, EVAL, "the engine weight version that was evaluated", "eval_prompt_data", "flows/tracking.py"),
    # ---- rollout: generation and rewards ----------------------------------------------------------
    Metric("rollout/raw_reward", ROLLOUT, "mean scalar reward before custom_reward_post_process_path", "always", _RM),
    Metric("rollout/rewards", ROLLOUT, "mean reward after the estimator's group normalisation (~0 for grpo; raw for ppo, "
           "reinforce++)", "always", _RM),
    Metric("rollout/response_lengths", ROLLOUT, "mean response length (tokens), the reference's train-side name", "always", _RM),
    Metric("rollout/total_lengths", ROLLOUT, "mean prompt + response length (tokens)", "always", _RM),
    Metric("rollout/truncated", ROLLOUT, "fraction of truncated samples, the reference's train-side name", "always", _RM),
    Metric("rollout/repetition_frac", ROLLOUT, "fraction of responses > 10000 characters whose last 10000 compress > 10x",
           "always", _RM),
    Metric("rollout/error_cat/<cat>", ROLLOUT, "fraction of the samples whose dict reward has reward[log_reward_category] "
           "== <cat>", "log_reward_category", _RM),
    Metric("rollout/response_len/mean", ROLLOUT, "mean response length (tokens)", "always", _RM),
    Metric("rollout/response_len/median", ROLLOUT, "median response length (tokens)", "always", _RM),
    Metric("rollout/response_len/max", ROLLOUT, "longest response (tokens)", "always", _RM),
    Metric("rollout/response_len/min", ROLLOUT, "shortest response (tokens)", "always", _RM),
    Metric("rollout/truncated_ratio", ROLLOUT, "fraction of samples that hit the length limit", "always", _RM),
    Metric("rollout/weight_version/mean", ROLLOUT, "mean of each sample's oldest engine weight version", "always", _RM),
    Metric("rollout/weight_version/median", ROLLOUT, "median of each sample's oldest weight version", "always", _RM),
    Metric("rollout/weight_version/max", ROLLOUT, "newest of the samples' oldest weight versions", "always", _RM),
    Metric("rollout/weight_version/min", ROLLOUT, "oldest weight version of the rollout", "always", _RM),
    Metric("rollout/weight_version/mixed_version_ratio", ROLLOUT, "fraction of samples generated under more than one "
           "weight version (partial rollout)", "always", _RM),
    Metric("rollout/zero_std/count_<r>", ROLLOUT, "groups whose rewards are all equal to r (rounded to 1 decimal)",
           "advantage_estimator other than ppo, when such groups occur", _RM),
    Metric("rollout/zero_std/all_zero_percentage", ROLLOUT, "fraction of groups whose rewards are all 0", "advantage_estimator "
           "other than ppo", _RM),
    Metric("rollout/zero_std/all_one_percentage", ROLLOUT, "fraction of groups whose rewards are all 1", "advantage_estimator "
           "other than ppo", _RM),
    Metric("passrate/pass@<k>", ROLLOUT, "unbiased pass@k over the complete groups (reward == 1 passes, as the reference), "
           "k = 1, 2, 4, ... <= group size", "log_passrate, n_samples_per_prompt > 1", _RM),
    Metric("rollout/dynamic_filter/drop_<reason>", ROLLOUT, "groups dropped by the dynamic-sampling filter, by reason",
           "dynamic_sampling_filter_path", "miles_core/rollout/generate.py"),
    Metric("rollout/staleness/mean", ROLLOUT, "mean weight syncs between a sample's generation and its training (0 when async_mode is off)",
           "always", _RM),
    Metric("rollout/staleness/max", ROLLOUT, "largest staleness of the rollout's samples (<= 1 with one_step, <= max_weight_staleness with fully)",
           "always", _RM),
    Metric("rollout/fully_async/queue_size", ROLLOUT, "scored groups left in the fully-async buffer after this rollout took its groups",
           "async_mode: fully", _FULLY),
    Metric("rollout/fully_async/stale_groups_filtered", ROLLOUT, "groups over max_weight_staleness not trained on in this rollout",
           "async_mode: fully", _FULLY),
    Metric("rollout/fully_async/stale_groups_recycled", ROLLOUT, "stale groups whose prompts were queued for regeneration",
           "async_mode: fully", _FULLY),
    Metric("rollout/fully_async/avg_staleness", ROLLOUT, "mean staleness (weight syncs) of the groups trained on", "async_mode: fully", _FULLY),
    Metric("rollout/fully_async/max_staleness", ROLLOUT, "largest staleness of the groups trained on", "async_mode: fully", _FULLY),
    Metric("rollout/fully_async/wait_time", ROLLOUT, "seconds the trainer waited for the buffer to hold enough groups",
           "async_mode: fully", _FULLY),
    Metric("rollout/partial_rollout/reused_groups", ROLLOUT,
           "groups this rollout took from the partial-rollout buffer (generated by an earlier rollout; filtered again)",
           "partial_rollout", "miles_core/rollout/generate.py"),
    Metric("rollout/partial_rollout/buffer_groups", ROLLOUT,
           "groups left in the partial-rollout buffer after this rollout (generated, not used yet; saved with checkpoints)",
           "partial_rollout", "miles_core/rollout/generate.py"),
    # ---- rollout: multi-turn generation (custom_generate_function_path) ------------------------------
    Metric("multi_turn/raw_response_length/response_length_mean", ROLLOUT, "mean response length over all response tokens (model and tool tokens)", "custom_generate_function_path", _MT),
    Metric("multi_turn/raw_response_length/response_length_max", ROLLOUT, "longest response, model and tool tokens", "custom_generate_function_path", _MT),
    Metric("multi_turn/raw_response_length/response_length_min", ROLLOUT, "shortest response, model and tool tokens", "custom_generate_function_path", _MT),
    Metric("multi_turn/raw_response_length/response_length_clip_ratio", ROLLOUT, "fraction of samples that used their whole response budget (TRUNCATED)", "custom_generate_function_path", _MT),
    Metric("multi_turn/wo_obs_response_length/response_length_mean", ROLLOUT, "mean count of model tokens (loss_mask 1; tool output excluded)", "custom_generate_function_path", _MT),
    Metric("multi_turn/wo_obs_response_length/response_length_max", ROLLOUT, "largest count of model tokens of a sample", "custom_generate_function_path", _MT),
    Metric("multi_turn/wo_obs_response_length/response_length_min", ROLLOUT, "smallest count of model tokens of a sample", "custom_generate_function_path", _MT),
    Metric("multi_turn/multi_turn_metric/round_number_mean", ROLLOUT, "mean model turns per sample", "custom_generate_function_path", _MT),
    Metric("multi_turn/multi_turn_metric/round_number_max", ROLLOUT, "most model turns of a sample", "custom_generate_function_path", _MT),
    Metric("multi_turn/multi_turn_metric/round_number_min", ROLLOUT, "fewest model turns of a sample", "custom_generate_function_path", _MT),
    Metric("rollout/round_number", ROLLOUT, "mean model turns per sample (reference name)", "custom_generate_function_path", _MT),
    Metric("multi_turn/tool_call_ratio", ROLLOUT, "fraction of samples that ran at least one tool call", "custom_generate_function_path", _MT),
    Metric("multi_turn/tool_calls/mean", ROLLOUT, "tool calls run per sample", "custom_generate_function_path", _MT),
    Metric("multi_turn/tool_calls/malformed", ROLLOUT, "tool calls the parser rejected (bad JSON, no name, arguments not an object), not run", "custom_generate_function_path", _MT),
    Metric("multi_turn/tool_calls/incomplete", ROLLOUT, "turns that stopped inside an unclosed tool call", "custom_generate_function_path", _MT),
    Metric("multi_turn/tool_failures/<reason>", ROLLOUT, "samples whose tool call failed, by reason (error, timeout, non_text); their reward is 0", "custom_generate_function_path", _MT),
    # ---- rollout: forward-only passes and advantages (trainer) ------------------------------------
    Metric("rollout/log_probs", ROLLOUT, "token mean of the old-policy log-probs", "always", _TRAINER),
    Metric("rollout/entropy", ROLLOUT, "the old policy's entropy: mean over samples of each one's masked token mean",
           "use_rollout_entropy", _TRAINER),
    Metric("rollout/rollout_log_probs", ROLLOUT, "token mean of the engine's log-probs", "always", _TRAINER),
    Metric("rollout/ref_log_probs", ROLLOUT, "token mean of the reference model's log-probs",
           "use_kl_loss with kl_loss_coef > 0, or kl_coef > 0", _TRAINER),
    Metric("rollout/correct_response_lengths", ROLLOUT, "mean response length of the samples whose raw reward is 1",
           "log_correct_samples, when a sample is correct", _RM),
    Metric("rollout/correct_length/<p>", ROLLOUT, "share of the correct samples (raw reward 1) whose response length is in "
           "that quarter of rollout_max_response_len (p25: <= 1/4 of it, p50, p75, p100: the first cut point >= the length)",
           "log_correct_samples, when a sample is correct", _RM),
    Metric("rollout/correct_entropy", ROLLOUT, "mean over the correct samples (raw reward 1) of -(each one's masked token "
           "mean of logp_old)", "log_correct_samples, when a sample is correct", _RM),
    Metric("rollout/advantages", ROLLOUT, "token mean of the final advantages", "always", f"{_ADV}/__init__.py"),
    Metric("rollout/zero_std_groups", ROLLOUT, "groups not divided by their std (std 0 or a single sample)",
           "advantage_estimator grpo, gspo or reinforce_plus_plus_baseline", f"{_ADV}/base.py"),
    Metric("rollout/reward_kl", ROLLOUT, "token mean of the reward-level KL", "kl_coef > 0 (ppo, reinforce++)", f"{_ADV}/base.py"),
    Metric("rollout/values", ROLLOUT, "token mean of the critic values V", "advantage_estimator: ppo", f"{_ADV}/ppo.py"),
    Metric("rollout/returns", ROLLOUT, "token mean of the GAE returns (critic targets)", "advantage_estimator: ppo", f"{_ADV}/ppo.py"),
    Metric("rollout/opd_reverse_kl", ROLLOUT, "token mean of logp_old - logp_teacher over the rollout", "use_opd",
           "miles_core/algorithms/opd.py"),
    # ---- perf (at rollout/step) -------------------------------------------------------------------
    Metric("perf/rollout_time", ROLLOUT, "seconds to generate and score the rollout", "always", _RM),
    Metric("perf/tokens_per_gpu_per_sec", ROLLOUT, "response tokens per second of generation per rollout GPU "
           "(rollout_num_gpus, 1 when unset)", "always", _RM),
    Metric("perf/effective_tokens_per_gpu_per_sec", ROLLOUT, "trainable (loss-mask) response tokens per second per rollout GPU",
           "always", _RM),
    Metric("perf/longest_sample_tokens_per_sec", ROLLOUT, "the longest response / rollout time", "always", _RM),
    Metric("perf/longest_effective_sample_tokens_per_sec", ROLLOUT, "the most trainable tokens of a response / rollout time",
           "always", _RM),
    Metric("perf/actor_train_time", ROLLOUT, "seconds of the train stage (forward-only passes and optimizer steps)", "always", _TRAINER),
    Metric("perf/actor_train_tok_per_s", ROLLOUT, "trained tokens per second (tokens * num_steps_per_rollout / time)", "always", _TRAINER),
    Metric("perf/train_time", ROLLOUT, "seconds of the trainer's train_rollout (forward-only passes and optimizer steps)",
           "always", _PERF),
    Metric("perf/train_wait_time", ROLLOUT, "seconds the trainer waited since its previous train ended (0 at the first)",
           "always", _PERF),
    Metric("perf/step_time", ROLLOUT, "train_wait_time + train_time", "always", _PERF),
    Metric("perf/wait_time_ratio", ROLLOUT, "train_wait_time / step_time", "always", _PERF),
    Metric("perf/log_probs_time", ROLLOUT, "seconds of the old-policy log-prob pass", "when it runs (not on-policy, "
           "not use_rollout_logprobs)", _PERF),
    Metric("perf/ref_log_probs_time", ROLLOUT, "seconds of the reference-model log-prob pass", "a reference model", _PERF),
    Metric("perf/teacher_log_probs_time", ROLLOUT, "seconds of the teacher pass", "use_opd with a teacher", _PERF),
    Metric("perf/log_probs_tflops", ROLLOUT, "2 * params * tokens / log_probs_time (TFLOP/s, attention not counted)",
           "when the old-policy pass runs", _PERF),
    Metric("perf/ref_log_probs_tflops", ROLLOUT, "2 * params * tokens / ref_log_probs_time (TFLOP/s)", "a reference model", _PERF),
    Metric("perf/actor_train_tflops", ROLLOUT, "3 * 2 * params * tokens * num_steps_per_rollout / train_time (TFLOP/s)",
           "always", _PERF),
    Metric("perf/mfu_peak_tflops", ROLLOUT, "the configured peak TFLOP/s of one device", "mfu_peak_tflops", _PERF),
    Metric("perf/actor_train_mfu", ROLLOUT, "actor_train_tflops / mfu_peak_tflops", "mfu_peak_tflops", _PERF),
    Metric("perf/save_model_time", ROLLOUT, "seconds to save the checkpoint", "save_interval (and the last rollout)", _LOCAL),
    Metric("perf/sleep_time", ROLLOUT, "seconds to move the trainer's state into host memory (after the weight sync)",
           "offload_train", _LOCAL),
    Metric("perf/wake_up_time", ROLLOUT, "seconds to move the trainer's state back onto its device (before the train "
           "stage)", "offload_train", _LOCAL),
    Metric("rollout/engine_restarts", ROLLOUT, "engine servers restarted so far, cumulative: by the health monitor "
           "(use_fault_tolerance) or found dead before a weight sync", "runtime: ray", "miles_core/rollout/http/fleet.py"),
    Metric("perf/update_weights_time", ROLLOUT, "seconds of the weight sync trainer -> engines (pause to continue, any "
           "update_weight_mode)", "always", "miles_core/weights/sync.py"),
    Metric("perf/update_weights_density", ROLLOUT, "disk-delta: the fraction of the weights' bytes that changed since the "
           "last sync (1 for a full version)", "update_weight_transfer_mode: disk-delta", "miles_core/weights/delta.py"),
    Metric("perf/update_weights_wire_bytes", ROLLOUT, "disk-delta: the bytes the sync wrote under update_weight_disk_dir "
           "(the compressed deltas, or the full version)", "update_weight_transfer_mode: disk-delta",
           "miles_core/weights/delta.py"),
    # ---- train: actor loss (summed over micro-batches of one optimizer step) ----------------------
    Metric("train/loss", TRAIN, "the total loss", "always", _LOSS),
    Metric("train/pg_loss", TRAIN, "policy-gradient loss R'(pg)", "loss_type: policy_loss", _LOSS),
    Metric("train/pg_clipfrac", TRAIN, "fraction of tokens on the clipped branch", "loss_type: policy_loss",
           "miles_core/algorithms/policy_loss.py"),
    Metric("train/ppo_kl", TRAIN, "R'(logp_old - logp) (sequence-level with gspo)", "loss_type: policy_loss",
           "miles_core/algorithms/policy_loss.py"),
    Metric("train/entropy_loss", TRAIN, "R'(entropy) of the current policy (0 unless computed)", "always; computed with entropy_coef > 0 or "
           "observe_training_entropy", _LOSS),
    Metric("train/kl_loss", TRAIN, "R'(kl(logp, logp_ref)) with kl_loss_type", "use_kl_loss with kl_loss_coef > 0", _LOSS),
    Metric("train/opd_reverse_kl", TRAIN, "R'(logp - logp_teacher) with the current policy", "use_opd", _LOSS),
    Metric("train/grad_norm", TRAIN, "global gradient norm before clipping", "always", _TRAINER),
    Metric("train/lr-pg_0", TRAIN, "actor learning rate of the step", "always", _TRAINER),
    # ---- train: rollout/train mismatch and corrections --------------------------------------------
    Metric("train/train_rollout_logprob_abs_diff", TRAIN, "R(|logp_old - logp_roll|)", "always", _CORR),
    Metric("train/train_rollout_kl", TRAIN, "R(low_var_kl(logp_roll vs logp_old))", "always", _CORR),
    Metric("train/ess_ratio", TRAIN, "mean over samples of the effective sample size ratio (sum w)^2 / (n sum w^2) of "
           "the policy ratio w = exp(logp - logp_old)", "loss_type: policy_loss", _LOSS),
    Metric("train/opsm_clipfrac", TRAIN, "share of each sample's tokens OPSM masked (A < 0 and mean logp_old - logp > "
           "opsm_delta), summed over samples / the step's denominator", "use_opsm", _LOSS),
    Metric("train/ois", TRAIN, "R(exp(logp - logp_old)), the PPO ratio", "use_tis, get_mismatch_metrics or custom_tis_function_path", _LOSS),
    Metric("train/tis", TRAIN, "R(w) of the TIS weights before the clamp", "use_tis or get_mismatch_metrics", "miles_core/algorithms/tis.py"),
    Metric("train/tis_clipfrac", TRAIN, "fraction of TIS weights outside [tis_clip_low, tis_clip]", "use_tis or get_mismatch_metrics",
           "miles_core/algorithms/tis.py"),
    Metric("train/tis_abs", TRAIN, "R(|w - 1|) of the TIS weights", "use_tis or get_mismatch_metrics", "miles_core/algorithms/tis.py"),
    Metric("train/mis_tis_weight_before_bound", TRAIN, "R(w) at tis_level", _MIS_ON, _MIS),
    Metric("train/mis_tis_weight_after_bound", TRAIN, "R(w) after the bound", _MIS_ON, _MIS),
    Metric("train/mis_tis_truncate_fraction", TRAIN, "R([w > upper])", f"{_MIS_ON}, tis_mode truncate", _MIS),
    Metric("train/mis_tis_clip_fraction_low", TRAIN, "R([w < lower])", f"{_MIS_ON}, tis_mode clip", _MIS),
    Metric("train/mis_tis_clip_fraction_high", TRAIN, "R([w > upper])", f"{_MIS_ON}, tis_mode clip", _MIS),
    Metric("train/mis_tis_mask_fraction_low", TRAIN, "R([w < lower])", f"{_MIS_ON}, tis_mode mask", _MIS),
    Metric("train/mis_tis_mask_fraction_high", TRAIN, "R([w > upper])", f"{_MIS_ON}, tis_mode mask", _MIS),
    Metric("train/mis_rs_mask_fraction_low", TRAIN, "R([w_rs < rs_lower])", f"{_MIS_ON}, use_rs", _MIS),
    Metric("train/mis_rs_mask_fraction_high", TRAIN, "R([w_rs > rs_upper])", f"{_MIS_ON}, use_rs", _MIS),
    Metric("train/mis_rs_catastrophic_token_fraction", TRAIN, "R([d_t < log rs_veto_threshold])", f"{_MIS_ON}, use_rs with the veto on", _MIS),
    Metric("train/mis_rs_catastrophic_seq_fraction", TRAIN, "fraction of samples with a catastrophic token", f"{_MIS_ON}, use_rs with the veto on", _MIS),
    Metric("train/mis_is_ratio_mean_after_tis_rs", TRAIN, "R(w) over the original mask before batch normalization", _MIS_ON, _MIS),
    Metric("train/mis_batch_norm_factor", TRAIN, "micro-batch mean weight times its share", f"{_MIS_ON}, tis_batch_normalize", _MIS),
    Metric("train/mis_is_ratio_mean_final", TRAIN, "R(final w) over the original mask", _MIS_ON, _MIS),
    Metric("train/mis_is_ratio_min_final", TRAIN, "mean over samples of the smallest final weight", _MIS_ON, _MIS),
    Metric("train/mis_is_ratio_max_final", TRAIN, "mean over samples of the largest final weight", _MIS_ON, _MIS),
    Metric("train/mis_training_log_ppl", TRAIN, "per-sample -mean logp_old", _MIS_ON, _MIS),
    Metric("train/mis_training_ppl", TRAIN, "per-sample exp(training log ppl)", _MIS_ON, _MIS),
    Metric("train/mis_rollout_log_ppl", TRAIN, "per-sample -mean logp_roll", _MIS_ON, _MIS),
    Metric("train/mis_rollout_ppl", TRAIN, "per-sample exp(rollout log ppl)", _MIS_ON, _MIS),
    Metric("train/mis_log_ppl_diff", TRAIN, "per-sample mean logp_roll - mean logp_old", _MIS_ON, _MIS),
    Metric("train/mis_log_ppl_abs_diff", TRAIN, "|mis_log_ppl_diff|", _MIS_ON, _MIS),
    Metric("train/mis_ppl_ratio", TRAIN, "per-sample exp(log_ppl_diff)", _MIS_ON, _MIS),
    Metric("train/mis_kl", TRAIN, "R(logp_roll - logp_old), k1 of KL(pi_roll || pi_old)", _MIS_ON, _MIS),
    Metric("train/mis_k3_kl", TRAIN, "k3 estimate of KL(pi_roll || pi_old)", _MIS_ON, _MIS),
    Metric("train/mis_chi2_token", TRAIN, "per-sample mean_t w_t^2 - 1", _MIS_ON, _MIS),
    Metric("train/mis_chi2_seq", TRAIN, "per-sample exp(2 sum_t d_t) - 1", _MIS_ON, _MIS),
    # ---- train: critic (ppo) ----------------------------------------------------------------------
    Metric("train/critic-value_loss", TRAIN, "clipped critic loss", "advantage_estimator: ppo", "miles_core/algorithms/value_loss.py"),
    Metric("train/critic-value_clipfrac", TRAIN, "fraction of tokens whose value moved more than value_clip",
           "advantage_estimator: ppo", "miles_core/algorithms/value_loss.py"),
    Metric("train/critic-grad_norm", TRAIN, "critic gradient norm before clipping", "advantage_estimator: ppo",
           "miles_core/training/rl_step.py"),
    Metric("train/critic-lr-pg_0", TRAIN, "critic learning rate of the step", "advantage_estimator: ppo",
           "miles_core/training/rl_step.py"),
    # ---- eval ---------------------------------------------------------------------------------------
    Metric("eval/duration_seconds", EVAL, "seconds of the whole eval", "eval_prompt_data", _POINT),
    Metric("eval/export_time_seconds", EVAL, "seconds to write the HF snapshot that was evaluated",
           "eval_mode: snapshot, or the eval flow on a checkpoint", _POINT),
    Metric("eval/lag_steps", EVAL, "weight versions the trainer (or the newest checkpoint) is ahead of the evaluated one when "
           "the eval lands", "eval_mode: snapshot, or the eval flow", "miles_core/evaluation/ledger.py"),
    Metric("eval/skipped_<reason>", EVAL, "1 at an eval point that did not run: busy, export_failed, ckpt_missing, crashed, "
           "unhealthy, pin_violation, or an EvalSkip(reason) of eval_function_path", "eval_prompt_data or eval_config",
           "miles_core/evaluation/skip.py"),
    Metric("eval/<ds>-none_reward_ratio", EVAL, "fraction of eval samples without a reward (0: a failed reward raises)",
           "eval_prompt_data", _EVAL),
    Metric("eval/<ds>/truncated_ratio", EVAL, "fraction of eval samples that hit the length limit",
           "eval_prompt_data", _EVAL),
    Metric("eval/<ds>/response_len/mean", EVAL, "mean eval response length", "eval_prompt_data", _EVAL),
    Metric("eval/<ds>/response_len/median", EVAL, "median eval response length", "eval_prompt_data", _EVAL),
    Metric("eval/<ds>/response_len/max", EVAL, "longest eval response", "eval_prompt_data", _EVAL),
    Metric("eval/<ds>/response_len/min", EVAL, "shortest eval response", "eval_prompt_data", _EVAL),
    Metric("eval/<ds>/repetition_frac", EVAL, "fraction of repetitive eval responses (as rollout/repetition_frac)",
           "eval_prompt_data", _EVAL),
    Metric("eval/<ds>/zero_std/count_<r>", EVAL, "eval prompts whose rewards are all equal to r", "eval_prompt_data", _EVAL),
    Metric("eval/<ds>/weight_version/mean", EVAL, "mean engine weight version of the eval samples (== eval/step when good)",
           "eval_prompt_data", _EVAL),
    Metric("eval/<ds>/weight_version/median", EVAL, "median weight version of the eval samples", "eval_prompt_data", _EVAL),
    Metric("eval/<ds>/weight_version/max", EVAL, "newest weight version of the eval samples", "eval_prompt_data", _EVAL),
    Metric("eval/<ds>/weight_version/min", EVAL, "oldest weight version of the eval samples", "eval_prompt_data", _EVAL),
    Metric("eval/<ds>/weight_version/mixed_version_ratio", EVAL, "fraction of eval samples generated under more than one "
           "weight version (0 when good)", "eval_prompt_data", _EVAL),
    Metric("eval/<ds>-pass@<k>", EVAL, "unbiased pass@k (reward == 1 passes), k = 1, 2, 4, ... <= n_samples_per_eval_prompt",
           "log_passrate, n_samples_per_eval_prompt > 1", _EVAL),
    Metric("eval/<ds>", EVAL, "mean eval reward of dataset ds (eval_reward_key)", "eval_prompt_data", _EVAL),
)

_extra: list[Metric] = []


class UncataloguedMetricError(ValueError):
    """A metric key that matches no catalog entry."""


def register(*metrics: Metric) -> None:
    """Add metrics of a custom extension (a custom loss or TIS function) to the catalog."""
    taken = {m.name for m in entries()}
    _extra.extend(m for m in metrics if m.name not in taken)


def entries() -> tuple[Metric, ...]:
    """Built-in entries, then registered ones."""
    return CATALOG + tuple(_extra)


def match(key: str) -> Metric | None:
    """The catalog entry a raw key belongs to: literal names first, then templates in catalog order."""
    for m in entries():
        if not m.is_template and m.name == key:
            return m
    for m in entries():
        if m.is_template and m.regex.match(key):
            return m
    return None


_seen: set[str] = set()  # keys already found in the catalog (entries are only ever added): the hot path is a set lookup


_warned: set[str] = set()


CHECK_MODES = ("error", "warn", "off")


def check_mode(text: str) -> str:
    """The value of MILES_METRICS_CHECK (any case) -> error | warn | off; anything else raises ValueError."""
    mode = text.lower()
    if mode not in CHECK_MODES:
        raise ValueError(f"{CHECK_ENV}={text!r}: expected {', '.join(CHECK_MODES)}")
    return mode


def check_keys(keys: Iterable[str]) -> None:
    """Raise (or warn, per MILES_METRICS_CHECK) for keys that match no catalog entry."""
    mode = check_mode(os.environ.get(CHECK_ENV, "warn"))
    if mode == "off":
        return
    new = [k for k in keys if k not in _seen]
    bad = sorted(k for k in new if match(k) is None)
    _seen.update(k for k in new if k not in bad)
    if not bad:
        return
    msg = (f"metric keys not in the catalog: {bad}. Add them to miles_core/tracking/catalog.py (CATALOG), or "
           f"register(Metric(...)) them from a custom extension ({CHECK_ENV}=error raises, warn warns, off skips)")
    if mode == "error":
        raise UncataloguedMetricError(msg)
    for k in bad:
        if k not in _warned:
            _warned.add(k)
            log.warning("%s", msg)

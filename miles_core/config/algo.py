"""Algorithm and optimizer arguments (REFERENCE §3)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ._base import Group

AdvantageEstimator = Literal["grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"]
KLType = Literal["k1", "k2", "k3", "low_var_kl"]


def parse_teacher_urls(entries: list[str] | None) -> dict[str, str]:
    """opd_teacher_urls ``NAME=URL`` entries -> {name: url} (split at the first ``=``, so a URL may hold one).
    Raises ValueError on an entry without a name or URL, or a name given twice."""
    urls: dict[str, str] = {}
    for entry in entries or []:
        name, sep, url = (x.strip() for x in entry.partition("="))
        if not sep or not name or not url:
            raise ValueError(f"opd_teacher_urls entry {entry!r}: expected NAME=URL (e.g. math=http://host:30001/generate)")
        if name in urls:
            raise ValueError(f"opd_teacher_urls names teacher {name!r} twice")
        urls[name] = url
    return urls


class AlgoConfig(Group):
    """How rewards become advantages and the losses, KL terms and AdamW settings of each optimizer step."""

    form_first = ("lr", "advantage_estimator")

    @property
    def train_entropy(self) -> bool:
        """The train step computes the entropy: it is in the loss (entropy_coef) or observed."""
        return self.entropy_coef != 0 or self.observe_training_entropy

    advantage_estimator: AdvantageEstimator = Field("grpo", description="How rewards become advantages.")
    num_steps_per_rollout: int | None = Field(None, ge=1, description="Optimizer steps per rollout; derives global_batch_size.")
    global_batch_size: int | None = Field(None, ge=1, description="Samples per optimizer step.")
    micro_batch_size: int = Field(1, ge=1, description="Samples per forward/backward pass (gradient accumulation inside a step).")
    lr: float = Field(1e-6, gt=0, description="Actor learning rate (AdamW).")
    min_lr: float = Field(0.0, ge=0, description="Final learning rate of a decaying schedule. Not supported yet: the torch "
                          "trainer's schedule is a linear warm-up to lr, then constant; a non-zero value is refused at load.")
    lr_warmup_iters: int = Field(0, ge=0, description="Linear warm-up optimizer steps.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    adam_beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1, in [0, 1).")
    adam_beta2: float = Field(0.98, ge=0, lt=1, description="AdamW beta2, in [0, 1).")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    clip_grad: float = Field(1.0, ge=0, description="Global gradient-norm clip (0 = off).")
    loss_type: Literal["policy_loss", "sft_loss", "custom_loss"] = Field("policy_loss", description="Loss function.")
    custom_loss_function_path: str | None = Field(None, description="Dotted path of a custom loss (loss_type custom_loss).")
    eps_clip: float = Field(0.2, gt=0, description="PPO clip range (lower).")
    eps_clip_high: float | None = Field(None, gt=0, description="PPO clip range (upper); defaults to eps_clip.")
    eps_clip_c: float | None = Field(None, gt=1, description="Dual-clip constant for negative advantages (> 1).")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus coefficient.")
    observe_training_entropy: bool = Field(
        False, description="Compute the policy's entropy in the train step even with entropy_coef 0, as a metric only "
                           "(detached): train/entropy_loss. Otherwise, with entropy_coef 0, the entropy is not computed and "
                           "train/entropy_loss is 0, as the reference.")
    use_kl_loss: bool = Field(False, description="Add a KL(policy || reference) loss term.")
    kl_loss_coef: float = Field(0.0, ge=0, description="Coefficient of the KL loss term.")
    kl_loss_type: KLType = Field("k1", description="KL estimator of the loss term.")
    use_unbiased_kl: bool = Field(
        False, description="use_kl_loss: weight each token's KL estimate by its importance ratio exp(logp - logp_old) "
                           "(kept in the graph), the unbiased estimate of KL(pi_theta || pi_ref) from samples of the old "
                           "policy (DeepSeek-V3.2); for low_var_kl the weighted value is clamped to [-10, 10].")
    kl_coef: float = Field(0.0, ge=0, description="Reward-level KL coefficient (ppo and reinforce++ only).")
    calculate_per_token_loss: bool = Field(False, description="Reduce losses as a token mean over the batch instead of a mean of per-sample means.")
    disable_grpo_std_normalization: bool = Field(False, description="GRPO without dividing by the group std (Dr.GRPO).")
    disable_rewards_normalization: bool = Field(False, description="No group centering or scaling of rewards.")
    normalize_advantages: bool = Field(False, description="Whiten advantages over the whole batch.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount factor (reinforce++, ppo).")
    lambd: float = Field(1.0, ge=0, le=1, description="GAE lambda (ppo).")
    value_clip: float = Field(0.2, gt=0, description="Critic value clip (ppo).")
    critic_lr: float | None = Field(None, gt=0, description="Critic learning rate (default lr).")
    critic_save: str | None = Field(
        None, description="advantage_estimator ppo, train_backend torch: the dir of the critic's checkpoints (its weights "
        "and AdamW state, <critic_save>/<rollout_id>/, written atomically before the actor's, same keep_last). None: the "
        "actor's save dir with a _critic suffix (<save>_critic, the reference's default).")
    critic_load: str | None = Field(
        None, description="advantage_estimator ppo, train_backend torch: the dir a resume loads the critic from, at the "
        "rollout of the actor's checkpoint (a missing one fails the resume). None: the actor's load dir with a _critic "
        "suffix (<load>_critic). An actor checkpoint that holds its critic (extra/critic.safetensors, written before "
        "critic_save existed) resumes it from there.")
    log_probs_chunk_size: int = Field(
        -1, description="train_backend torch: the forward-only log-prob passes (old policy, reference) upcast the logits to "
                        "float32 and take the log-softmax this many response positions at a time: a [N, chunk, V] float32 "
                        "copy instead of [N, T, V] (-1: all at once). The model's own [N, T, V] logits are still computed "
                        "in one forward, and the train step's forward (which needs the entropy) is not chunked.")
    ref_update_interval: int | None = Field(
        None, ge=1, description="Every this many rollouts (after rollout i when (i+1) % interval == 0) the reference model "
                                "takes the policy's current weights, so the KL terms pull toward a recent policy (None: the "
                                "reference stays the initial model). train_backend torch; the reference is then saved in "
                                "each checkpoint.")
    reset_optimizer_states: bool = Field(
        False, description="Zero the AdamW state (step count and both moments) of the actor and the critic before each "
                           "rollout's optimizer steps, as the reference's train loop does: every rollout's first step is a "
                           "fresh Adam step on the weights so far.")
    critic_lr_warmup_iters: int = Field(
        0, ge=0, description="Linear warm-up optimizer steps of the critic (ppo; the actor's is lr_warmup_iters).")
    num_critic_only_steps: int = Field(0, ge=0, description="Rollouts that train only the critic before the actor starts (ppo).")
    use_opsm: bool = Field(
        False, description="Off-Policy Sequence Masking: a sample with negative advantages whose mean log-prob under the "
                           "current policy is below the old policy's by more than opsm_delta gets no policy-gradient loss "
                           "on those tokens (train/opsm_clipfrac: the masked share).")
    opsm_delta: float = Field(1e-4, description="use_opsm: the threshold on the sequence's mean logp_old - logp.")
    use_tis: bool = Field(False, description="Truncated importance sampling against the rollout log-probs.")
    get_mismatch_metrics: bool = Field(
        False, description="Run the rollout correction as the reference does with this flag: the one of "
                           "custom_tis_function_path, else vanilla TIS (so the pg loss IS weighted by the clamped "
                           "exp(logp_old - logp_roll), as with use_tis), logging ois and the correction's metrics "
                           "(train/tis, tis_clipfrac, tis_abs).")
    tis_clip: float = Field(2.0, gt=0, description="Upper clamp of TIS weights.")
    tis_clip_low: float = Field(0.0, ge=0, description="Lower clamp of TIS weights.")
    use_rollout_logprobs: bool = Field(False, description="Use the engine's log-probs as old-policy log-probs.")
    custom_tis_function_path: str | None = Field(None, description="Dotted path of a TIS/MIS function (e.g. the built-in MIS).")
    custom_config_path: str | None = Field(None, description="YAML with knobs for custom functions (MIS settings).")
    custom_pg_loss_reducer_function_path: str | None = Field(
        None, description="Dotted path of a reducer factory for the pg loss only (e.g. Dr.GRPO's constant divisor), the "
                          "reference's signature: fn(total_lengths, response_lengths, loss_masks, calculate_per_token_loss) "
                          "-> reduce, called per micro-batch with per-sample lists (the masks after any rollout correction); "
                          "reduce(pg [sum of response_lengths], the samples' response tokens concatenated) -> the micro-batch's "
                          "sum, divided by the step's global batch size (by its token count with calculate_per_token_loss) as "
                          "the reference's loss scaling does. Every other term and metric keeps the default reduction.")
    disable_compute_advantages_and_returns: bool = Field(
        False, description="Skip the forward-only passes (old policy, reference, teacher) and the advantages: the loss gets "
                           "none of them (old_log_probs, ref_log_probs, teacher_log_probs, advantages None), for sft_loss or a "
                           "custom_loss that needs none; rollout/log_probs, rollout/advantages and the mismatch metrics are "
                           "not logged.")
    use_rollout_entropy: bool = Field(
        False, description="Compute the old policy's entropy in its forward-only pass, logged as rollout/entropy (the mean "
                           "over samples of each one's masked token mean), as the reference; the pass then always runs. "
                           "train_backend torch; not with use_rollout_logprobs (no old-policy pass).")
    skip_actor_forward_only: bool = Field(
        False, description="Never run the old-policy forward-only pass: logp_old is the step's own detached log-probs (the "
                           "importance ratio is exactly 1), or the engine's with use_rollout_logprobs. Needs one optimizer step "
                           "per rollout and a dropout-free model; rollout/log_probs is not logged. Without it the pass is "
                           "skipped anyway whenever that gives the same step (rl_step.on_policy).")
    use_opd: bool = Field(False, description="On-policy distillation from a teacher.")
    opd_kl_coef: float = Field(1.0, ge=0, description="OPD advantage coefficient.")
    opd_type: Literal["megatron", "sglang"] = Field("megatron", description="Teacher: a second in-process model (megatron) or an engine (sglang).")
    opd_teacher_load: str | None = Field(None, description="Teacher checkpoint (HF dir or builtin://) of use_opd: loaded in process "
                                          "(opd_type megatron) or served as a scoring engine (opd_type sglang).")
    opd_log_prob_top_k: int = Field(
        0, ge=0, description="Top-k OPD (the reference's 'Rethinking On-Policy Distillation' recipe): the advantage penalty "
                             "is a weighted reverse KL over a set of the student's and teacher's k likeliest tokens at each "
                             "position (opd_top_k_strategy, opd_reward_weight_mode) instead of the sampled token's "
                             "logp_old - logp_teacher; 0: sampled-token OPD. The student side is the old policy's full "
                             "distribution (train_backend torch); the teacher an in-process model (opd_type megatron) or "
                             "opd_teacher_urls.")
    opd_top_k_strategy: Literal["only-student", "only-teacher", "intersection", "union", "xor"] = Field(
        "only-student", description="Top-k OPD's token set per position: the student's top-k, the teacher's, their "
                                    "intersection, union, or symmetric difference (xor: weights not normalised).")
    opd_reward_weight_mode: Literal["student_p", "teacher_p", "none"] = Field(
        "student_p", description="Top-k OPD's weights over the token set: the student's probabilities, the teacher's, or "
                                 "uniform, renormalised over the set (xor: exp(logp) or 1).")
    opd_teacher_urls: list[str] | None = Field(
        None, description="OPD teachers behind SGLang's POST /generate as NAME=URL entries (e.g. "
                          "math=http://h1:30001/generate): each sample is scored, prefill-only, by the teacher its "
                          "metadata[opd_teacher_key] names; the name 'default' serves samples without a known name. "
                          "opd_type sglang, no opd_teacher_load, rollout_temperature 1 (SGLang's input log-probs are "
                          "not divided by a temperature).")
    opd_teacher_key: str = Field("opd_teacher", description="The sample metadata key naming its teacher in opd_teacher_urls "
                                                              "(from the data's metadata_key column).")

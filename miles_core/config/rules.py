"""Cross-field rules, checked when a config is built. Each message names the fields and the fix."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .train import TrainConfig


def _batch_invariant(c: "TrainConfig") -> None:
    r, a = c.rollout, c.algo
    n = r.rollout_batch_size * r.n_samples_per_prompt
    lhs = f"rollout_batch_size ({r.rollout_batch_size}) * n_samples_per_prompt ({r.n_samples_per_prompt}) = {n}"
    steps, gbs = a.num_steps_per_rollout, a.global_batch_size
    if steps is not None and gbs is not None and gbs * steps != n:
        raise ValueError(
            f"batch invariant broken: {lhs} must equal global_batch_size ({gbs}) * num_steps_per_rollout ({steps}) = {gbs * steps}; "
            "set only one of global_batch_size / num_steps_per_rollout, or make the products equal"
        )
    if steps is not None and n % steps:
        raise ValueError(f"batch invariant broken: {lhs} is not divisible by num_steps_per_rollout ({steps}); choose a divisor of {n}")
    if gbs is not None and n % gbs:
        raise ValueError(f"batch invariant broken: {lhs} is not divisible by global_batch_size ({gbs}); choose a divisor of {n}")


def _algo_rules(c: "TrainConfig") -> None:
    a = c.algo
    if a.use_tis and a.use_rollout_logprobs:
        raise ValueError("use_tis and use_rollout_logprobs are mutually exclusive: TIS corrects trainer log-probs against rollout log-probs; set one of them")
    if a.advantage_estimator.startswith("reinforce_plus_plus") and not a.normalize_advantages:
        raise ValueError(f"advantage_estimator {a.advantage_estimator} needs normalize_advantages: true")
    if a.kl_coef > 0 and a.advantage_estimator not in ("ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        raise ValueError(
            f"kl_coef (reward-level KL) applies only to ppo and reinforce++, not advantage_estimator {a.advantage_estimator}; "
            "use use_kl_loss with kl_loss_coef instead"
        )
    if a.loss_type == "custom_loss" and not a.custom_loss_function_path:
        raise ValueError("loss_type custom_loss needs custom_loss_function_path (a dotted path to the loss function)")
    if a.use_opd and a.opd_type == "megatron" and not a.opd_teacher_load:
        raise ValueError("use_opd with opd_type megatron needs opd_teacher_load (the teacher's HF dir or builtin:// name)")


def _rollout_rules(c: "TrainConfig") -> None:
    from miles_core.rewards import validate_rm_type

    r = c.rollout
    if r.over_sampling_batch_size is not None and r.over_sampling_batch_size < r.rollout_batch_size:
        raise ValueError(
            f"over_sampling_batch_size ({r.over_sampling_batch_size}) must be >= rollout_batch_size ({r.rollout_batch_size})"
        )
    if r.group_rm and not r.custom_rm_path:
        raise ValueError("group_rm needs custom_rm_path (a function scoring a whole group)")
    if not r.custom_rm_path:
        validate_rm_type(r.rm_type)
        if r.rm_type.removeprefix("boxed_") == "remote_rm" and not r.rm_url:
            raise ValueError("rm_type remote_rm needs rm_url")
    if c.data.prompt_data is None:
        raise ValueError("prompt_data is required: a jsonl/parquet path (optionally path@[a:b]) or builtin://<task>")


def _runtime_rules(c: "TrainConfig") -> None:
    cl = c.cluster
    if cl.runtime == "local" and (cl.rollout_engine != "hf" or cl.train_backend != "torch"):
        raise ValueError(
            f"runtime local runs rollout_engine hf with train_backend torch (got {cl.rollout_engine}/{cl.train_backend}); "
            "use runtime ray for sglang or megatron"
        )
    if cl.runtime == "local" and cl.update_weight_mode not in (None, "tensor"):
        raise ValueError(f"update_weight_mode {cl.update_weight_mode} needs runtime ray (the local runtime copies weights in "
                         "process); set runtime: ray or drop update_weight_mode")
    if cl.torch_compile and cl.train_backend != "torch":
        raise ValueError(f"torch_compile compiles the torch trainer's layers; train_backend {cl.train_backend} has its own "
                         "kernels: drop torch_compile or use train_backend torch")
    ev = c.eval.eval_prompt_data
    if ev is not None and len(ev) % 2:
        raise ValueError(f"eval_prompt_data takes name path pairs; got an odd number of items: {ev}")


def _async_rules(c: "TrainConfig") -> None:
    r, ck = c.rollout, c.checkpoint
    if r.async_mode == "off":
        for name in ("max_weight_staleness", "fully_async_buffer_groups"):
            if getattr(r, name) is not None:
                raise ValueError(f"{name} applies only with async_mode fully (got async_mode off); set async_mode: fully or drop {name}")
        if r.update_weights_interval != 1:
            raise ValueError("update_weights_interval applies only with async_mode one_step or fully; set async_mode or drop it")
        return
    if r.async_mode == "one_step" and (r.max_weight_staleness is not None or r.fully_async_buffer_groups is not None):
        raise ValueError("max_weight_staleness and fully_async_buffer_groups apply only with async_mode fully; "
                         "one_step is stale by at most one weight sync by construction")
    if c.cluster.colocate:
        raise ValueError(f"async_mode {r.async_mode} needs disaggregated engines (colocate: false): colocated engines are "
                         "offloaded while the trainer runs, so nothing can generate meanwhile")
    if r.partial_rollout:
        raise ValueError(f"partial_rollout does not combine with async_mode {r.async_mode}: the async buffer already keeps unused groups")
    if ck.save_interval is not None and ck.save_interval % r.update_weights_interval:
        raise ValueError(
            f"save_interval ({ck.save_interval}) must be a multiple of update_weights_interval ({r.update_weights_interval}) with "
            f"async_mode {r.async_mode}: a resumed run syncs weights right after its checkpoint, so one must have followed it"
        )
    if r.fully_async_buffer_groups is not None and r.fully_async_buffer_groups < r.rollout_batch_size:
        raise ValueError(f"fully_async_buffer_groups ({r.fully_async_buffer_groups}) must be >= rollout_batch_size ({r.rollout_batch_size})")


def _multi_turn_rules(c: "TrainConfig") -> None:
    from miles_core.rollout.multi_turn import check_multi_turn_config

    check_multi_turn_config(c)


def check_rules(c: "TrainConfig") -> None:
    for rule in (_batch_invariant, _algo_rules, _rollout_rules, _runtime_rules, _async_rules, _multi_turn_rules):
        rule(c)

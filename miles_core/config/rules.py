"""Cross-field rules, checked when a config is built. Each message names the fields and the fix.

Pure: these rules read the config's own values (and the installed megatron-core's version) only. Checks
that need the library's registries (rm_type, loss and extension-point paths, multi-turn functions, the
metrics catalog, the model's shape) are miles_core/assemble.py's, run by the CLI and the flows after load.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .algo import parse_teacher_urls
from .cluster import ClusterConfig
from .data import REFERENCE_DATA_SOURCES
from .rules_lora import LORA_SERVER_ARGS, lora_rules  # noqa: F401  (LORA_SERVER_ARGS: launch.py names it here)

if TYPE_CHECKING:
    from .train import TrainConfig

# sglang_router_ip / sglang_router_port: why an SGLang router already running cannot be used
ROUTER_WHY = ("the reference registers its engines with the SGLang router at that address and generates through it; "
              "miles' router runs in the driver and reaches every engine itself (generate and weight syncs), so an outside "
              "router would get no engines: drop it (engines already running: rollout_external_engine_addrs)")
NO_DISK_OFFLOAD = ("the reference's disk offload of the train state (torch_memory_saver's disk backend, its streamed Adam) "
                   "is not built: offload_train (cpu) is the only trainer offload")
# Fields kept under the reference's names that no code honours yet: a non-default value is refused at load,
# naming the field (never accepted and ignored). Implementing one removes its line (tests/config/test_fields_honoured.py).
NOT_SUPPORTED: dict[str, str] = {
    "min_lr": "the torch trainer's schedule is a linear warm-up (lr_warmup_iters) to lr, then constant: there is no decay to a minimum",
    "offload_train_disk_dir": "it applies only with offload_train_target disk: " + NO_DISK_OFFLOAD,
    "sglang_router_ip": ROUTER_WHY,
    "sglang_router_port": ROUTER_WHY,
}
# Estimators whose baseline is the group mean: with one sample per prompt every advantage is 0.
GROUP_BASELINE_ESTIMATORS = ("grpo", "gspo", "reinforce_plus_plus_baseline")


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
    if a.use_unbiased_kl and not a.use_kl_loss:
        raise ValueError("use_unbiased_kl weights the KL loss term, which is off: set use_kl_loss (with kl_loss_coef), or drop "
                         "use_unbiased_kl")
    if a.ref_update_interval is not None:
        if not c.needs_ref_model:
            raise ValueError("ref_update_interval needs a reference model: set use_kl_loss with kl_loss_coef > 0, or kl_coef > 0 "
                             "(without a KL term there is no reference to update); or drop ref_update_interval")
        if c.cluster.train_backend != "torch":
            raise ValueError(f"ref_update_interval is not supported yet with train_backend {c.cluster.train_backend} (its "
                             "reference is a forward-only megatron stage with no update path); use train_backend torch, or drop it")
        if c.lora.lora_rank > 0:
            raise ValueError("ref_update_interval is not supported with LoRA (lora_rank > 0), as in the reference: the "
                             "reference is the frozen base; drop one of them")
    if a.get_mismatch_metrics and a.use_rollout_logprobs:
        raise ValueError("get_mismatch_metrics with use_rollout_logprobs is not supported yet: the reference then also "
                         "scores the batch with the trainer to compare it with the engine; drop one of them")
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
    _opd_rules(c)
    if a.tis_clip_low > a.tis_clip:
        raise ValueError(f"tis_clip_low ({a.tis_clip_low}) must be <= tis_clip ({a.tis_clip}): TIS weights are clamped to "
                         "[tis_clip_low, tis_clip]")
    G = c.rollout.n_samples_per_prompt
    if G == 1 and a.advantage_estimator in GROUP_BASELINE_ESTIMATORS and not a.disable_rewards_normalization:
        raise ValueError(f"advantage_estimator {a.advantage_estimator} with n_samples_per_prompt 1: the group baseline is the "
                         "sample's own reward, so every advantage is 0 and nothing trains; use n_samples_per_prompt >= 2, "
                         "or disable_rewards_normalization: true (raw rewards)")
    _mis_options(a)
    _skipped_passes(c)


def _opd_rules(c: "TrainConfig") -> None:
    """opd_teacher_urls / opd_teacher_key (HTTP teachers) and top-k OPD: what applies with what (the reference's
    arguments.py OPD checks, plus what our teacher paths need)."""
    a = c.algo
    if not a.use_opd:
        for name in ("opd_teacher_urls", "opd_teacher_key", "opd_log_prob_top_k", "opd_top_k_strategy", "opd_reward_weight_mode"):
            if getattr(a, name) != type(a).model_fields[name].default:
                raise ValueError(f"{name} is set but use_opd is not: add use_opd: true, or drop {name}")
        return
    if a.opd_teacher_urls:
        parse_teacher_urls(a.opd_teacher_urls)
        if a.opd_type != "sglang" or a.opd_teacher_load:
            raise ValueError("opd_teacher_urls (teachers behind SGLang's /generate) needs opd_type sglang and no "
                             "opd_teacher_load (an in-process teacher); use one teacher source")
        if c.rollout.rollout_temperature != 1.0:
            raise ValueError(f"opd_teacher_urls with rollout_temperature {c.rollout.rollout_temperature}: SGLang's "
                             "prefill-only input log-probs are log_softmax of the raw logits, while the policy's are divided "
                             "by rollout_temperature, so the KL would compare different temperatures; use rollout_temperature "
                             "1, or an in-process teacher (opd_type megatron with opd_teacher_load)")
    elif a.opd_teacher_key != type(a).model_fields["opd_teacher_key"].default:
        raise ValueError("opd_teacher_key names the metadata key that routes samples among opd_teacher_urls, which is "
                         "not set: add opd_teacher_urls, or drop opd_teacher_key")
    if not a.opd_log_prob_top_k:
        for name in ("opd_top_k_strategy", "opd_reward_weight_mode"):
            if getattr(a, name) != type(a).model_fields[name].default:
                raise ValueError(f"{name} applies to top-k OPD only: set opd_log_prob_top_k > 0, or drop {name}")
        return
    if not a.opd_teacher_urls and not (a.opd_type == "megatron" and a.opd_teacher_load):
        raise ValueError("opd_log_prob_top_k needs a teacher that answers top-k queries: an in-process teacher (opd_type "
                         "megatron with opd_teacher_load) or opd_teacher_urls; the samples' teacher_log_probs and an "
                         "opd_type sglang engine teacher give sampled-token log-probs only")
    if c.cluster.train_backend != "torch":
        raise ValueError(f"opd_log_prob_top_k is not supported with train_backend {c.cluster.train_backend}: it needs the "
                         "old policy's full distribution, which the megatron engine's vocab-parallel logits do not gather; "
                         "use train_backend torch")


def _skipped_passes(c: "TrainConfig") -> None:
    """disable_compute_advantages_and_returns and skip_actor_forward_only: what the reference's train_actor then
    skips, and the combinations its checks (arguments.py: validate_skip_actor_forward_only) refuse."""
    a = c.algo
    if a.disable_compute_advantages_and_returns:
        needs = [name for name, on in (
            (f"loss_type {a.loss_type} (it reads advantages and old log-probs)", a.loss_type == "policy_loss"),
            ("advantage_estimator ppo (the critic trains on the returns)", a.advantage_estimator == "ppo"),
            ("a KL term (use_kl_loss with kl_loss_coef > 0, or kl_coef)", c.needs_ref_model), ("use_opd", a.use_opd),
            ("skip_actor_forward_only", a.skip_actor_forward_only)) if on]
        if needs:
            raise ValueError(f"disable_compute_advantages_and_returns skips the forward-only passes and the advantages, "
                             f"which {needs[0]} needs: use loss_type sft_loss or a custom_loss that reads neither, or drop "
                             "disable_compute_advantages_and_returns")
    if a.use_rollout_entropy:
        if c.cluster.train_backend != "torch":
            raise ValueError(f"use_rollout_entropy is not supported yet with train_backend {c.cluster.train_backend} (its "
                             "old-policy pass computes log-probs only); use train_backend torch, or drop it")
        for name in ("use_rollout_logprobs", "skip_actor_forward_only", "disable_compute_advantages_and_returns"):
            if getattr(a, name):
                raise ValueError(f"use_rollout_entropy computes the entropy in the old-policy pass, which {name} skips; "
                                 "drop one of them")
    if c.tracking.log_correct_samples:
        for name in ("skip_actor_forward_only", "disable_compute_advantages_and_returns"):
            if getattr(a, name):
                raise ValueError(f"log_correct_samples with {name} is not supported: its rollout/correct_entropy reads the "
                                 "old-policy log-probs, which that skips (the reference refuses it too); drop one of them")
    if not a.skip_actor_forward_only:
        return
    if c.cluster.train_backend != "torch":
        raise ValueError(f"skip_actor_forward_only is not supported yet with train_backend {c.cluster.train_backend}: its "
                         "engine always runs the old-policy pass (its step forward is not checked to replay it); use "
                         "train_backend torch, or drop it")
    refused = [name for name, on in (
        (f"num_steps_per_rollout {c.num_steps_per_rollout} (it needs 1: the later steps' logp_old would be the updated "
         "policy's)", c.num_steps_per_rollout != 1),
        (f"loss_type {a.loss_type} (policy_loss only)", a.loss_type != "policy_loss"), ("kl_coef", a.kl_coef != 0),
        ("use_opd", a.use_opd), ("advantage_estimator ppo", a.advantage_estimator == "ppo")) if on]
    if refused:
        raise ValueError(f"skip_actor_forward_only with {refused[0]} is not supported (the advantages or the loss would "
                         "need the skipped old-policy pass): drop one of them")


def _mis_options(a) -> None:
    """The built-in MIS reads its knobs from custom_config_path: check them now, not at the first train step."""
    from .mis import MIS_NAMES, MISConfig, load_options

    if a.custom_tis_function_path not in MIS_NAMES:
        return
    try:
        MISConfig(**load_options(a.custom_config_path))
    except (OSError, ValueError) as exc:
        raise ValueError(f"custom_config_path={a.custom_config_path!r} (MIS settings): {exc}") from exc


def _promotion_rules(c: "TrainConfig") -> None:
    ck = c.checkpoint
    if ck.promotion_gate == "manual" and not (ck.registered_model_name and ck.champion_metric and ck.export_interval):
        raise ValueError("promotion_gate manual gates the champion alias of exports: it needs export_interval, registered_model_name "
                         "and champion_metric; set them, or promotion_gate: auto")


def _rollout_rules(c: "TrainConfig") -> None:
    r = c.rollout
    if r.over_sampling_batch_size is not None and r.over_sampling_batch_size < r.rollout_batch_size:
        raise ValueError(
            f"over_sampling_batch_size ({r.over_sampling_batch_size}) must be >= rollout_batch_size ({r.rollout_batch_size})"
        )
    if r.group_rm and not r.custom_rm_path:
        raise ValueError("group_rm needs custom_rm_path (a function scoring a whole group)")
    if not r.custom_rm_path and r.rm_type.removeprefix("boxed_") == "remote_rm" and not r.rm_url:
        raise ValueError("rm_type remote_rm needs rm_url")
    if r.mask_offpolicy_in_partial_rollout and not r.partial_rollout:
        raise ValueError("mask_offpolicy_in_partial_rollout applies to the groups partial_rollout buffers; set partial_rollout: "
                         "true or drop it")
    if r.buffer_filter_path and not (r.partial_rollout or r.rollout_function_path or r.rollout_all_samples_process_path):
        raise ValueError("buffer_filter_path applies to the groups partial_rollout buffers (or a rollout_function_path / "
                         "rollout_all_samples_process_path function's, data_source.add_samples); set one or drop it")
    if c.data.prompt_data is None and not c.data.disable_rollout_global_dataset:
        raise ValueError("prompt_data is required: a jsonl/parquet path (optionally path@[a:b]) or builtin://<task> (or "
                         "disable_rollout_global_dataset with a rollout_function_path function that makes the prompts)")
    _custom_rollout_rules(c)


LOOP_FIELDS = ("custom_generate_function_path", "dynamic_sampling_filter_path", "over_sampling_batch_size", "partial_rollout",
               "rollout_sample_filter_path", "rollout_all_samples_process_path")


def _custom_rollout_rules(c: "TrainConfig") -> None:
    """rollout_function_path replaces miles' generate loop (rollout/custom_rollout.py); what configures that loop is refused
    beside it, and what needs it is refused without it."""
    r, d = c.rollout, c.data
    fn = r.rollout_function_path
    if d.disable_rollout_global_dataset:
        if fn is None:
            raise ValueError("disable_rollout_global_dataset leaves miles' generate loop without prompts: it needs a "
                             "rollout_function_path function that makes them")
        if d.prompt_data is not None:
            raise ValueError("disable_rollout_global_dataset loads no prompt dataset: drop prompt_data (or the flag)")
        if r.num_rollout is None or d.num_epoch != 1:
            raise ValueError("disable_rollout_global_dataset: without a dataset there are no epochs; set num_rollout (and drop "
                             "num_epoch)")
    if d.data_source_path not in REFERENCE_DATA_SOURCES and fn is None:
        raise ValueError(f"data_source_path {d.data_source_path} is handed to a rollout_function_path function; miles' generate "
                         "loop draws from its own data source: set rollout_function_path or drop data_source_path")
    if (fn or r.rollout_all_samples_process_path) and (r.async_mode == "fully" or c.misc.train_only):
        name = "rollout_function_path" if fn else "rollout_all_samples_process_path"
        why = "async_mode fully generates in miles' background worker" if r.async_mode == "fully" else \
            "debug_train_only / load_debug_rollout_data generate nothing"
        raise ValueError(f"{name} is not supported with this run: {why}; drop one of them")
    if fn is None:
        return
    loop = [f for f in LOOP_FIELDS if getattr(r, f) not in (None, False)]
    if loop:
        raise ValueError(f"{', '.join(loop)} configure miles' generate loop, which rollout_function_path replaces (the "
                         "reference's built-in generate_rollout reads them; your function gets them in args if set under "
                         "another name): drop them")
    if c.eval.enabled and c.eval.eval_function_path is None:
        raise ValueError("rollout_function_path with eval datasets: the reference evaluates with the rollout function "
                         "(evaluation=True), which miles does not call for eval; set eval_function_path (default: miles' "
                         "built-in eval) or drop eval_prompt_data / eval_config")


def _runtime_rules(c: "TrainConfig") -> None:
    from .backends import unsupported

    cl = c.cluster
    if cl.torch_compile and cl.train_backend != "torch":
        raise ValueError(f"torch_compile compiles the torch trainer's layers; train_backend {cl.train_backend} has its own "
                         "kernels: drop torch_compile or use train_backend torch")
    if cl.mfu_peak_tflops is not None and cl.train_backend != "torch":
        raise ValueError(f"mfu_peak_tflops is not supported yet with train_backend {cl.train_backend}: only the torch trainer "
                         "reports perf/actor_train_mfu; drop mfu_peak_tflops or use train_backend torch")
    if cl.train_env_vars and cl.runtime != "ray":
        raise ValueError(f"train_env_vars ({', '.join(sorted(cl.train_env_vars))}) sets the environment of the Ray train "
                         "actors; the local runtime trains in this process: set them in its environment, or use runtime: ray")
    external = c.rollout.external_engines
    if external and c.rollout.rollout_external_engine_addrs is None:
        raise ValueError("rollout_external uses engines already running, at rollout_external_engine_addrs, which is unset: "
                         "give their host:port addresses, or drop rollout_external (miles then launches the engines)")
    refused = unsupported(cl.runtime, cl.train_backend, cl.rollout_engine, launched=not external)
    if refused:
        raise ValueError(refused)
    if external:
        _external_rules(c)
    elif cl.runtime == "local" and cl.update_weight_mode not in (None, "tensor"):
        raise ValueError(f"update_weight_mode {cl.update_weight_mode} needs runtime ray (the local runtime copies weights in "
                         "process); set runtime: ray or drop update_weight_mode")
    _offload_rules(c, external)
    _transfer_rules(c)
    if cl.runtime == "ray" and c.eval.eval_mode == "snapshot":
        raise ValueError("eval_mode snapshot is not supported yet with runtime ray; use eval_mode: inline")
    if c.eval.eval_hf_dir is not None and c.eval.eval_mode != "snapshot":
        raise ValueError("eval_hf_dir stages the HF snapshots of eval_mode snapshot; inline eval exports none: set eval_mode: "
                         "snapshot or drop eval_hf_dir")
    ev = c.eval.eval_prompt_data
    if ev is not None and len(ev) % 2:
        raise ValueError(f"eval_prompt_data takes name path pairs; got an odd number of items: {ev}")


P2P_REFUSAL = ("p2p writes each bucket into the engines' registered memory with Mooncake's transfer engine (the reference's "
               "UpdateWeightP2P, p2p_transfer_utils.py), which miles does not build")
DELTA_FIELDS = ("update_weight_disk_dir", "update_weight_local_checkpoint_dir", "update_weight_delta_encoding",
                "update_weight_delta_checksum", "custom_update_weight_post_write_path")


def _transfer_rules(c: "TrainConfig") -> None:
    cl = c.cluster
    mode = cl.update_weight_transfer_mode
    if mode == "p2p":
        raise ValueError(f"update_weight_transfer_mode p2p is not supported: {P2P_REFUSAL}; use update_weight_transfer_mode: "
                         "broadcast, or update_weight_mode: disk (the engines reload a full HF dir)")
    if mode != "disk-delta":
        defaults = {n: ClusterConfig.model_fields[n].default for n in DELTA_FIELDS}
        set_ = [n for n in DELTA_FIELDS if getattr(cl, n) != defaults[n]]
        if set_:
            raise ValueError(f"{set_[0]} applies only to update_weight_transfer_mode disk-delta (it is {mode}): set "
                             "update_weight_transfer_mode: disk-delta or drop it")
        return
    _delta_rules(c)


def _delta_rules(c: "TrainConfig") -> None:
    """disk-delta (the reference's checks, miles/utils/arguments.py ~3273-3295, and what miles does not build)."""
    cl = c.cluster
    if cl.rollout_engine == "sglang":
        raise ValueError("update_weight_transfer_mode disk-delta is not supported yet with rollout_engine sglang: its "
                         "engines apply deltas with a /pull_weights route that SGLang 0.5.23 does not serve (not in "
                         "miles_core/rollout/sglang/protocol.json); use rollout_engine: hf (miles' engines serve it), or "
                         "update_weight_mode: disk (the engines reload a full HF dir)")
    if cl.colocate:
        raise ValueError("update_weight_transfer_mode disk-delta is for engines that are not colocated (the reference "
                         "refuses it with colocate: a colocated sync hands tensors over in place); set colocate: false")
    if cl.update_weight_mode is not None:
        raise ValueError(f"update_weight_mode {cl.update_weight_mode} and update_weight_transfer_mode disk-delta both pick "
                         "the weight sync: drop one")
    if c.lora.lora_rank > 0:
        raise ValueError("update_weight_transfer_mode disk-delta with lora_rank > 0 is not supported yet (the reference "
                         "refuses LoRA weight sync there too); use update_weight_transfer_mode: broadcast")
    for name in ("update_weight_disk_dir", "update_weight_local_checkpoint_dir"):
        if not getattr(cl, name):
            raise ValueError(f"update_weight_transfer_mode disk-delta needs {name} (the published deltas; the engines' "
                             "local checkpoint): set it")
    shared, local = (os.path.abspath(getattr(cl, n)) for n in ("update_weight_disk_dir", "update_weight_local_checkpoint_dir"))
    if os.path.commonpath((shared, local)) in (shared, local):
        raise ValueError(f"update_weight_local_checkpoint_dir {cl.update_weight_local_checkpoint_dir} and "
                         f"update_weight_disk_dir {cl.update_weight_disk_dir} overlap: the engines patch the first in "
                         "place, the trainer clears the second; give two separate directories")
    if cl.update_weight_delta_checksum == "blake3":
        raise ValueError("update_weight_delta_checksum blake3 is not supported yet: the blake3 package is not among miles' "
                         "dependencies; use xxh3-128 (the default) or adler32")


def _offload_rules(c: "TrainConfig", external: bool) -> None:
    cl = c.cluster
    explicit = cl.offload_rollout is not None or cl.offload_rollout_level != ["kv_cache", "weight"] or cl.offload
    if cl.runtime == "local" and not external and explicit:
        raise ValueError("offload_rollout / offload_rollout_level / offload release engine servers' memory; the local runtime's "
                         "engine shares this process's memory with the trainer, so there is nothing to release: drop them "
                         "(offload_train alone offloads the trainer), or use runtime: ray (or rollout_external_engine_addrs)")
    if cl.offload_rollout and c.rollout.async_mode != "off":  # colocated async: _async_rules says why
        raise ValueError(f"offload_rollout releases the engines' memory while the trainer runs, but async_mode "
                         f"{c.rollout.async_mode} generates then: set offload_rollout: false (or async_mode: off)")


def _external_rules(c: "TrainConfig") -> None:
    """rollout_external_engine_addrs: engines miles neither launches nor places (rollout_engine names their protocol)."""
    cl, mode = c.cluster, c.cluster.weight_sync_mode
    if cl.colocate:
        raise ValueError("colocate shares devices with engines miles launches; rollout_external_engine_addrs engines run "
                         "elsewhere: set colocate: false or drop rollout_external_engine_addrs")
    if mode == "tensor" and cl.rollout_engine == "sglang":
        raise ValueError("rollout_external_engine_addrs with rollout_engine sglang: SGLang's /update_weights_from_tensor takes "
                         "in-process handles that cannot cross HTTP; set update_weight_mode: disk")
    if c.sglang.sglang_server_args:
        raise ValueError(f"sglang_{next(iter(c.sglang.sglang_server_args))}: SGLang server arguments are passed to engines "
                         "miles launches; rollout_external_engine_addrs engines run with their own: drop the sglang_* keys")


def _async_rules(c: "TrainConfig") -> None:
    r, ck = c.rollout, c.checkpoint
    fully_only = [n for n in ("max_weight_staleness", "fully_async_buffer_groups", "async_max_concurrent_samples", "stale_group_policy")
                  if getattr(r, n) is not None] + (["async_data_buffer_capacity_factor"] if r.async_data_buffer_capacity_factor != 2.0 else [])
    fully_only += ["async_unused_samples_handler"] if r.async_unused_samples_handler != "drop" else []
    if r.async_mode == "off":
        for name in fully_only:
            raise ValueError(f"{name} applies only with async_mode fully (got async_mode off); set async_mode: fully or drop {name}")
        if r.update_weights_interval != 1:
            raise ValueError("update_weights_interval applies only with async_mode one_step or fully; set async_mode or drop it")
        return
    if r.async_mode == "one_step" and fully_only:
        raise ValueError(f"{', '.join(fully_only)} apply only with async_mode fully; "
                         "one_step is stale by at most one weight sync by construction")
    if r.stale_group_policy is not None and r.async_unused_samples_handler != "drop":
        raise ValueError("stale_group_policy and async_unused_samples_handler both choose what happens to a stale group; set one")
    if r.fully_async_buffer_groups is not None and r.async_data_buffer_capacity_factor != 2.0:
        raise ValueError("fully_async_buffer_groups and async_data_buffer_capacity_factor both size the fully-async buffer; set one")
    if int(r.async_data_buffer_capacity_factor * r.rollout_batch_size) < 1:
        raise ValueError(f"async_data_buffer_capacity_factor ({r.async_data_buffer_capacity_factor}) * rollout_batch_size "
                         f"({r.rollout_batch_size}) leaves a buffer of 0 groups; raise it")
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


MEGATRON_CORE_MIN = (0, 16, 1)
MEGATRON_INSTALL = "pip install 'megatron-core==0.16.1' psutil"
# Fields the torch trainer does not read (it is data parallel only): name -> default
MEGATRON_ONLY = {
    "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "context_parallel_size": 1,
    "expert_model_parallel_size": 1, "expert_tensor_parallel_size": None, "sequence_parallel": False, "padded_vocab_size": None,
    "recompute_granularity": None, "recompute_method": None, "recompute_num_layers": None,
    "use_dynamic_batch_size": False, "balance_by_flops": False, "max_tokens_per_gpu": None, "log_probs_max_tokens_per_gpu": None,
    "use_distributed_optimizer": False, "distributed_timeout_minutes": 10, "recompute_loss_function": False,
    "custom_megatron_init_path": None, "custom_megatron_before_log_prob_hook_path": None,
    "custom_megatron_before_train_step_hook_path": None, "custom_megatron_post_save_hook_path": None,
}


MEGATRON_ONLY_WHY = {
    "padded_vocab_size": "the torch trainer trains the HF model's own embedding, vocab_size rows",
    "recompute_loss_function": "the torch trainer's log-probs come out of the model's forward (training/batch.py), with no "
                               "separate loss from the logits to recompute",
}


def _megatron_core_version() -> tuple[int, ...] | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return tuple(int(x) for x in version("megatron-core").split(".")[:3] if x.isdigit())
    except PackageNotFoundError:
        return None


def _parallel_rules(c: "TrainConfig") -> None:
    p, backend = c.parallel, c.cluster.train_backend
    if backend == "torch":
        for name, default in MEGATRON_ONLY.items():
            if getattr(p, name) != default:
                why = MEGATRON_ONLY_WHY.get(name, "a hook of the reference's Megatron trainer" if name.startswith(
                    "custom_megatron_") else "the torch trainer is data parallel only")
                raise ValueError(f"{name} ({getattr(p, name)}) is read by train_backend megatron only ({why}); set "
                                 f"train_backend: megatron or drop {name}")
    _train_offload_rules(c)
    _critic_dir_rules(c)
    _async_save_rule(c)
    if backend == "torch" and c.checkpoint.model_name is not None:
        raise ValueError("model_name (the reference's converter name) picks the Megatron trainer's HF <-> Megatron tensor mapping; "
                         "the torch trainer loads the HF model by its config.json: set train_backend: megatron or drop model_name")
    if p.padded_vocab_size is not None and p.padded_vocab_size % p.tensor_model_parallel_size:
        raise ValueError(f"padded_vocab_size ({p.padded_vocab_size}) must be a multiple of tensor_model_parallel_size "
                         f"({p.tensor_model_parallel_size}): each TP rank holds an equal share of the vocab rows")
    if p.context_parallel_size > 1:
        raise ValueError(f"context_parallel_size {p.context_parallel_size} is not supported yet (context parallel needs Transformer "
                         "Engine's attention); set context_parallel_size: 1")
    if p.sequence_parallel:
        raise ValueError("sequence_parallel is not supported yet: the trainer builds megatron-core's local layer spec, whose torch "
                         "norms refuse sequence parallel (it needs Transformer Engine or Apex norms); set sequence_parallel: false")
    full = p.recompute_granularity == "full"
    if (p.recompute_method is not None or p.recompute_num_layers is not None) and not full:
        raise ValueError("recompute_method and recompute_num_layers apply only with recompute_granularity full; set it or drop them")
    if full and (p.recompute_method is None or p.recompute_num_layers is None):
        raise ValueError("recompute_granularity full needs recompute_method (uniform | block) and recompute_num_layers")
    if p.megatron_to_hf_mode == "bridge":
        raise ValueError("megatron_to_hf_mode bridge converts with Megatron-Bridge (megatron.bridge.AutoBridge), which miles "
                         "does not install or use; its Megatron trainer converts with its own per-family converters (the "
                         "reference's raw mode, training/megatron/weights.py): set megatron_to_hf_mode: raw")
    if p.qkv_format == "bshd" and backend != "megatron":
        raise ValueError(f"qkv_format bshd (padded micro-batches) is only supported with train_backend megatron, as in the "
                         f"reference; train_backend {backend} packs its samples: drop qkv_format or set it to thd")
    if p.qkv_format == "bshd" and p.use_dynamic_batch_size:
        raise ValueError("qkv_format bshd pads micro_batch_size samples per micro-batch; use_dynamic_batch_size packs them "
                         "(thd), as in the reference: drop one of them")
    if p.balance_by_flops and not p.use_dynamic_batch_size:
        raise ValueError("balance_by_flops balances the packed micro-batches of use_dynamic_batch_size, which is off (the "
                         "reference requires it too): set use_dynamic_batch_size with max_tokens_per_gpu, or drop it")
    if p.use_dynamic_batch_size and p.max_tokens_per_gpu is None:
        raise ValueError("use_dynamic_batch_size needs max_tokens_per_gpu (tokens per packed micro-batch)")
    if not p.use_dynamic_batch_size and (p.max_tokens_per_gpu is not None or p.log_probs_max_tokens_per_gpu is not None):
        raise ValueError("max_tokens_per_gpu / log_probs_max_tokens_per_gpu apply only with use_dynamic_batch_size; set it or drop them")
    if backend == "megatron":
        _megatron_rules(c)


def _critic_dir_rules(c: "TrainConfig") -> None:
    """critic_save / critic_load: the ppo critic's own checkpoint dirs (the torch trainer's)."""
    a, backend = c.algo, c.cluster.train_backend
    for name in ("critic_save", "critic_load"):
        if getattr(a, name) is None:
            continue
        if a.advantage_estimator != "ppo":
            raise ValueError(f"{name} is the ppo critic's checkpoint dir; advantage_estimator {a.advantage_estimator} "
                             f"trains no critic: drop {name}")
        if backend != "torch":
            raise ValueError(f"{name} is not supported yet with train_backend {backend}: its critic is saved in the "
                             f"actor's torch_dist checkpoint (training/megatron/checkpoint.py); drop {name}")
    if a.critic_save is not None and c.critic_save_dir == c.save_dir:
        raise ValueError(f"critic_save ({a.critic_save}) is the actor's save dir: the two checkpoints would share one "
                         "latest pointer; give the critic a dir of its own (default <save>_critic)")


def _async_save_rule(c: "TrainConfig") -> None:
    if c.checkpoint.async_save and c.cluster.train_backend != "torch":
        raise ValueError("async_save is not supported yet with train_backend megatron: its torch_dist checkpoints are saved "
                         "synchronously and atomically (megatron-core's dist_checkpointing.save, then rename and the latest "
                         "pointer); Megatron-LM's async save (megatron.training.async_utils) is not used: drop async_save")


def _train_offload_rules(c: "TrainConfig") -> None:
    """offload_train (and offload, which sets it): what it cannot alternate with (the reference's arguments.py)."""
    p, cl, m = c.parallel, c.cluster, c.misc
    _rematerialize_rules(c)
    if p.offload_train_target != "cpu":
        raise ValueError(f"offload_train_target {p.offload_train_target} is not supported yet ({NO_DISK_OFFLOAD}); set "
                         "offload_train_target: cpu")
    if cl.offload:
        for name, value in (("offload_train", p.offload_train), ("offload_rollout", cl.offload_rollout)):
            if value is False:
                raise ValueError(f"offload sets offload_train and offload_rollout, but {name} is false: drop offload or {name}")
    asked = "offload_train" if p.offload_train else "offload" if cl.offload else None
    if asked is None:
        return
    if c.rollout.async_mode != "off":
        raise ValueError(f"{asked} moves the trainer off its device while the engines generate, but async_mode "
                         f"{c.rollout.async_mode} generates while it trains: set async_mode: off, or drop {asked}")
    for name, on, why in (("debug_rollout_only", m.debug_rollout_only, "there is no train stage"),
                          ("debug_train_only", m.train_only, "there are no engines to make room for (load_debug_rollout_data "
                                                             "sets it)")):
        if on:
            raise ValueError(f"{asked} with {name}: {why}, so nothing alternates with the trainer; drop {asked}")


def _rematerialize_rules(c: "TrainConfig") -> None:
    """rematerialize_param_from_master_weight rebuilds offload_train's 16-bit weights from the fp32 main weights of
    megatron-core's mixed-precision optimizer (the reference's arguments.py asserts offload_train, megatron, no LoRA)."""
    p, name = c.parallel, "rematerialize_param_from_master_weight"
    if p.check_rematerialize_param_from_master_weight and not p.rematerialize_param_from_master_weight:
        raise ValueError(f"check_rematerialize_param_from_master_weight checks {name}, which is off: set {name}: true, "
                         "or drop check_rematerialize_param_from_master_weight")
    if not p.rematerialize_param_from_master_weight:
        return
    if not c.offloads_trainer:
        raise ValueError(f"{name} rebuilds the weights offload_train dropped, but offload_train is off: set "
                         f"offload_train: true (or colocate: true), or drop {name}")
    if c.cluster.train_backend != "megatron":
        raise ValueError(f"{name} is not supported with train_backend {c.cluster.train_backend}: its parameters are the "
                         "fp32 weights the optimizer steps, with no separate main weights to rebuild them from; use "
                         f"train_backend megatron with dtype bfloat16 or float16, or drop {name}")
    if c.misc.dtype not in ("bfloat16", "float16"):
        raise ValueError(f"{name} is not supported with dtype {c.misc.dtype}: megatron's optimizer then steps the "
                         "parameters themselves (no fp32 main copy to rebuild from); use dtype bfloat16 or float16, or "
                         f"drop {name}")
    if c.lora.lora_rank > 0:
        raise ValueError(f"{name} with lora_rank > 0 is not supported yet (the frozen base has no main weights; the "
                         f"reference refuses it too); drop {name}")


def _megatron_rules(c: "TrainConfig") -> None:
    found = _megatron_core_version()
    if found is None or found < MEGATRON_CORE_MIN:
        have = "not installed" if found is None else "version " + ".".join(map(str, found))
        raise ValueError(f"train_backend megatron needs megatron-core >= 0.16.1 ({have}); install it: {MEGATRON_INSTALL}")
    a = c.algo
    if a.use_opd and a.opd_teacher_load and a.opd_type == "sglang":
        raise ValueError("use_opd with opd_type sglang and opd_teacher_load (a teacher engine the trainer starts) is not supported "
                         "yet on train_backend megatron; use opd_type megatron (the teacher in the trainer's process) or "
                         "train_backend torch")
    p, cl = c.parallel, c.cluster
    tp, pp, ep, etp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.expert_model_parallel_size, p.expert_tp
    world = cl.actor_num_nodes * cl.actor_num_gpus_per_node if cl.runtime == "ray" else 1
    sizes = f"tensor_model_parallel_size ({tp}) * pipeline_model_parallel_size ({pp}) * context_parallel_size ({p.context_parallel_size})"
    if world % p.model_parallel:
        raise ValueError(f"world size {world} (actor_num_nodes * actor_num_gpus_per_node; 1 on runtime local) must be a multiple "
                         f"of {sizes} = {p.model_parallel} (world = TP * PP * CP * DP); change the sizes or the actor counts")
    if world % (etp * ep * pp):
        raise ValueError(f"world size {world} must be a multiple of expert_tensor_parallel_size ({etp}) * expert_model_parallel_size "
                         f"({ep}) * pipeline_model_parallel_size ({pp}); change the expert sizes or the actor counts")


def check_model_divides(shape, p, source: str) -> None:
    """heads and kv heads by TP, layers by PP, routed experts by EP; each error names both fields and the fix."""
    tp, pp, ep = p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.expert_model_parallel_size
    pairs = [("num_attention_heads", shape.num_attention_heads, "tensor_model_parallel_size", tp),
             ("num_key_value_heads", shape.num_key_value_heads, "tensor_model_parallel_size", tp),
             ("num_hidden_layers", shape.num_hidden_layers, "pipeline_model_parallel_size", pp)]
    if not shape.num_experts and ep > 1:
        raise ValueError(f"expert_model_parallel_size ({ep}) splits the routed experts of an MoE model, but {source} is dense "
                         "(its config.json has no num_experts / n_routed_experts); set expert_model_parallel_size to 1")
    if shape.num_experts:
        pairs.append(("num_experts", shape.num_experts, "expert_model_parallel_size", ep))
    for model_field, n, field, size in pairs:
        if n % size or n == 0:
            raise ValueError(f"{field} ({size}) must divide the model's {model_field} ({n}, {source}); "
                             f"choose a {field} that divides {n}")


def _sglang_rules(c: "TrainConfig") -> None:
    sg = c.sglang
    if c.cluster.rollout_engine == "sglang" and c.cluster.weight_sync_mode == "tensor" and c.cluster.runtime == "ray":
        raise ValueError("update_weight_mode tensor with rollout_engine sglang: SGLang 0.5.23's /update_weights_from_tensor "
                         "takes serialized_named_tensors (per TP rank, MultiprocessingSerializer payloads of CUDA-IPC handles; "
                         "io_struct.py UpdateWeightsFromTensorReqInput), which miles does not build yet; set "
                         "update_weight_mode: disk (or broadcast with colocate: false)")
    if sg.sglang_server_args and c.cluster.rollout_engine != "sglang":
        first = next(iter(sg.sglang_server_args))
        raise ValueError(f"sglang_{first}: SGLang server arguments apply only with rollout_engine sglang "
                         f"(got {c.cluster.rollout_engine}); set rollout_engine: sglang or drop the sglang_* keys")
    for name in ("sglang_router_ip", "sglang_router_port"):
        if getattr(sg, name) is not None:
            raise ValueError(f"{name} is not supported yet: miles routes requests with its own router "
                             "(least-loaded healthy engine); drop it")


def _torch_only_options(c: "TrainConfig") -> None:
    """Trainer options of the reference that only the torch trainer implements, and the debug switches."""
    m = c.misc
    if m.debug_disable_optimizer and c.cluster.train_backend != "torch":
        raise ValueError(f"debug_disable_optimizer is not supported yet with train_backend {c.cluster.train_backend} (its optimizer "
                         "step is megatron-core's own); use train_backend torch, or drop it")
    if c.algo.log_probs_chunk_size != -1 and c.algo.log_probs_chunk_size < 1:
        raise ValueError(f"log_probs_chunk_size must be -1 (no chunking) or >= 1, got {c.algo.log_probs_chunk_size}")
    if c.algo.log_probs_chunk_size != -1 and c.cluster.train_backend != "torch":
        raise ValueError(f"log_probs_chunk_size is not supported yet with train_backend {c.cluster.train_backend} (its log-probs "
                         "are computed by megatron's vocab-parallel cross-entropy); drop it, or use train_backend torch")
    if m.debug_skip_weight_update and c.eval.enabled:
        raise ValueError("debug_skip_weight_update with eval datasets is not supported yet: eval points are logged per weight "
                         "version, which stays 0; drop eval_prompt_data / eval_config, or debug_skip_weight_update")


def _start_rules(c: "TrainConfig") -> None:
    """start_rollout_id: what it cannot combine with (its checkpoint needs are checked at restore)."""
    if c.data.start_rollout_id is None:
        return
    if c.rollout.async_mode != "off":
        raise ValueError(f"start_rollout_id with async_mode {c.rollout.async_mode} is not supported yet: the checkpoint's "
                         "prefetched rollout or group buffer belongs to the rollout after it; drop one of them")
    if c.rollout.num_rollout is not None and c.data.start_rollout_id >= c.rollout.num_rollout:
        raise ValueError(f"start_rollout_id ({c.data.start_rollout_id}) must be below num_rollout ({c.rollout.num_rollout})")


def _tracking_rules(c: "TrainConfig") -> None:
    t, r = c.tracking, c.rollout
    if not t.wandb_always_use_train_step:
        return
    if not t.use_wandb:
        raise ValueError("wandb_always_use_train_step sets the steps of the W&B mirror, which is off: set use_wandb, or drop it")
    why = [name for name, on in (
        ("debug_skip_weight_update (no sync: every eval point is weight version 0)", c.misc.debug_skip_weight_update),
        ("debug_rollout_only (no sync)", c.misc.debug_rollout_only),
        (f"update_weights_interval {r.update_weights_interval} (a sync every n rollouts)",
         r.async_mode != "off" and r.update_weights_interval != 1)) if on]
    if why:
        raise ValueError(f"wandb_always_use_train_step with {why[0]} is not supported yet: it maps an eval point's weight "
                         "version to the rollout it follows, which needs one weight sync per rollout; drop one of them")


def _ci_rules(c: "TrainConfig") -> None:
    """The ci group acts only with ci_test (as the reference, where its checks sit behind args.ci_test): set without it, a
    flag would do nothing, so it is refused."""
    m = c.misc
    needs = [n for n in ("ci_disable_kl_checker", "ci_disable_logprobs_checker", "ci_disable_weight_update_checker",
                         "ci_save_model_hash", "ci_check_model_hash")
             if getattr(m, n)] + [n for n in ("ci_metric_checker_key", "ci_save_grad_norm", "ci_load_grad_norm") if getattr(m, n) is not None]
    if needs and not m.ci_test:
        raise ValueError(f"{', '.join(needs)} act only with ci_test (the reference's CI checks): set ci_test, or drop them")
    if (m.ci_metric_checker_key is None) != (m.ci_metric_checker_threshold is None):
        raise ValueError("ci_metric_checker_key and ci_metric_checker_threshold go together: set both (the eval metric and the "
                         "value it must reach), or neither")
    if m.ci_save_grad_norm is not None and m.ci_load_grad_norm is not None:
        raise ValueError("ci_save_grad_norm and ci_load_grad_norm: set one (save in the first run, compare in the rerun)")
    for name in ("ci_save_grad_norm", "ci_load_grad_norm"):
        template = getattr(m, name)
        if template is not None:
            try:
                template.format(role="actor", rollout_id=0, step_id=0)
            except (KeyError, IndexError, ValueError) as e:
                raise ValueError(f"{name} {template!r} is not a path template of {{role}}, {{rollout_id}}, {{step_id}}: "
                                 f"{type(e).__name__} {e}") from None
    if m.check_weight_update_equal and (m.debug_rollout_only or m.train_only or m.debug_skip_weight_update):
        raise ValueError("check_weight_update_equal checks a weight sync, and debug_rollout_only / debug_train_only / "
                         "load_debug_rollout_data / debug_skip_weight_update send none: drop one of them")
    if m.check_weight_update_selector == "draft":
        raise ValueError("check_weight_update_selector draft: miles' engines serve no draft (MTP) model; use all or target")
    changed = [n for n, off in (("check_weight_update_skip_list", m.check_weight_update_skip_list is None),
                                ("check_weight_update_allow_quant_error", not m.check_weight_update_allow_quant_error),
                                ("check_weight_update_selector", m.check_weight_update_selector == "all")) if not off]
    if changed and not m.check_weights:
        raise ValueError(f"{', '.join(changed)} shape the weight-update check, which is off: set check_weight_update_equal "
                         "(or ci_test), or drop them")
    if m.ci_metric_checker_key is not None and not c.eval.enabled:
        raise ValueError("ci_metric_checker_key judges eval points, and this run has no eval datasets: set eval_prompt_data / "
                         "eval_config, or drop ci_metric_checker_key")


def _template(name: str, template: str | None, **keys) -> None:
    if template is not None:
        try:
            template.format(**keys)
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"{name} {template!r} is not a path template of {', '.join('{' + k + '}' for k in keys)}: "
                             f"{type(e).__name__} {e}") from None


def _debug_data_rules(c: "TrainConfig") -> None:
    """The reference's debug dumps and one-sided runs (debug_rollout_only, debug_train_only / load_debug_rollout_data)."""
    m = c.misc
    for name in ("save_debug_rollout_data", "save_debug_trajectory_data", "load_debug_rollout_data", "ci_inject_rollout_data_path"):
        _template(name, getattr(m, name), rollout_id=0)
    _template("save_debug_train_data", m.save_debug_train_data, rollout_id=0, rank=0)
    given = [n for n in ("save_debug_rollout_data", "save_debug_train_data", "save_debug_trajectory_data") if getattr(m, n)]
    if m.dump_details is not None and given:
        raise ValueError(f"dump_details sets {', '.join(given)} itself (under {m.dump_details}/): drop one of them")
    if m.save_debug_trajectory_data is not None and m.save_debug_rollout_data is None:
        raise ValueError("save_debug_trajectory_data is written with the rollout dump: set save_debug_rollout_data too")
    if m.rollout_dump is not None and c.eval.enabled:
        raise ValueError("save_debug_rollout_data (or dump_details) with eval datasets is not supported yet: the reference also dumps the eval "
                         "samples (eval_<id>), which miles' eval does not return; drop eval_prompt_data / eval_config, or use "
                         "log_samples for the eval completions")
    if m.load_debug_rollout_data_subsample is not None and m.load_debug_rollout_data is None:
        raise ValueError("load_debug_rollout_data_subsample subsamples loaded rollouts: set load_debug_rollout_data")
    if m.debug_rollout_only and m.train_only:
        raise ValueError("debug_rollout_only and debug_train_only (or load_debug_rollout_data) cannot be set together: set one")
    if m.debug_train_only and m.load_debug_rollout_data is None:
        raise ValueError("debug_train_only runs without rollout engines, so the rollouts come from load_debug_rollout_data: set it")
    one_sided = "debug_rollout_only" if m.debug_rollout_only else "debug_train_only / load_debug_rollout_data" if m.train_only else None
    if one_sided and c.eval.enabled:
        raise ValueError(f"{one_sided} with eval datasets is not supported: "
                         + ("the weights never change (weight_version stays 0)" if m.debug_rollout_only else "there are no engines to evaluate with")
                         + "; drop eval_prompt_data / eval_config")
    if m.debug_rollout_only and c.checkpoint.export_interval is not None:
        raise ValueError("debug_rollout_only never trains: an export would be the loaded weights; drop export_interval")
    if m.train_only and (c.cluster.runtime != "local" or c.rollout.rollout_external_engine_addrs or c.rollout.async_mode != "off"):
        raise ValueError("debug_train_only / load_debug_rollout_data is supported with runtime local, async_mode off and no "
                         "rollout_external_engine_addrs (the Ray placement always starts its engines)")
    if (m.ci_inject_rollout_data_path is None) != (m.ci_inject_rollout_data_start_rollout_id is None):
        raise ValueError("ci_inject_rollout_data_path and ci_inject_rollout_data_start_rollout_id go together: set both")
    if m.ci_inject_rollout_data_path is not None and m.train_only:
        raise ValueError("ci_inject_rollout_data_path replaces generated rollouts while the engines run; it cannot be combined "
                         "with load_debug_rollout_data / debug_train_only")


def _champion_rule(c: "TrainConfig") -> None:
    """champion_metric belongs to a registered model and is judged by an eval (the metric name itself is checked
    against the metrics catalog by miles_core/assemble.py)."""
    metric, ck = c.checkpoint.champion_metric, c.checkpoint
    if metric is None:
        return
    if not ck.registered_model_name:
        raise ValueError("champion_metric needs registered_model_name: the champion alias belongs to a registered model")
    if not c.eval.enabled:
        raise ValueError(f"champion_metric {metric} needs eval datasets (eval_prompt_data or eval_config): the champion is "
                         "judged by the eval of the exported weights")


def _not_supported(c: "TrainConfig") -> None:
    for name, why in NOT_SUPPORTED.items():
        group = next(getattr(c, g) for g in type(c).model_fields if name in type(getattr(c, g)).model_fields)
        value, default = getattr(group, name), type(group).model_fields[name].default
        if value != default:
            raise ValueError(f"{name} is not supported yet ({why}); drop it (got {value!r}, default {default!r})")


def check_rules(c: "TrainConfig") -> None:
    for rule in (_not_supported, _batch_invariant, _algo_rules, _rollout_rules, _runtime_rules, _async_rules, _parallel_rules,
                 _sglang_rules, _champion_rule, _promotion_rules, lora_rules, _torch_only_options, _ci_rules,
                 _debug_data_rules, _tracking_rules, _start_rules):
        rule(c)

"""The LoRA fields' cross-field rules (config/lora.py; docs/guide/lora.md), checked by rules.check_rules."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .train import TrainConfig

# SGLang arguments the launcher sets from the LoRA fields when engines serve the adapter (rollout/sglang/launch.py).
LORA_SERVER_ARGS = ("enable_lora", "max_loras_per_batch", "max_lora_rank", "lora_target_modules")


def lora_rules(c: "TrainConfig") -> None:
    lo = c.lora
    if not lo.enabled:
        set_ = [n for n in ("target_modules", "exclude_modules", "lora_adapter_path") if getattr(lo, n) is not None]
        set_ += [n for n in ("lora_sync_from_tensor", "lora_train_only") if getattr(lo, n)]
        set_ += ["check_lora_weight_equal"] * c.misc.check_lora_weight_equal
        if set_:
            raise ValueError(f"{', '.join(set_)} apply only with lora_rank > 0 (got lora_rank 0, LoRA off); set lora_rank or drop them")
        return
    _lora_sync_rules(c)
    if c.cluster.train_backend == "megatron" and lo.lora_dropout > 0:
        raise ValueError(f"lora_rank ({lo.lora_rank}) with train_backend megatron and lora_dropout {lo.lora_dropout} is not "
                         "supported yet: dropout on the adapters' input would have to draw the same mask on every TP rank "
                         "(docs/decisions.md, LoRA); set lora_dropout: 0.0, or use train_backend torch")
    world = c.cluster.actor_num_nodes * c.cluster.actor_num_gpus_per_node
    if c.cluster.runtime == "ray" and world > 1 and c.cluster.train_backend == "megatron":
        raise ValueError(f"lora_rank ({lo.lora_rank}) with train_backend megatron on a train group of {world} ranks "
                         "(actor_num_nodes * actor_num_gpus_per_node) is not supported yet: the Megatron trainer's adapters "
                         "are built and tested at TP=2 in one process group, not yet on a Ray train group (docs/decisions.md, "
                         "LoRA); set actor_num_nodes and actor_num_gpus_per_node to 1, or use train_backend torch (FSDP2)")
    if lo.target_modules is None:
        raise ValueError("lora_rank > 0 needs target_modules: all-linear, or module names (e.g. q_proj,k_proj,v_proj,o_proj)")
    if lo.targets != "all-linear" and not set(lo.targets) - set(lo.excluded):
        raise ValueError(f"exclude_modules ({lo.exclude_modules}) removes every module of target_modules ({lo.target_modules}); "
                         "nothing would be trained")
    if c.algo.advantage_estimator == "ppo":
        raise ValueError("lora_rank with advantage_estimator ppo is not supported yet: the critic is a full copy of the policy, "
                         "not an adapter; use grpo, gspo or reinforce++")


def _lora_sync_rules(c: "TrainConfig") -> None:
    lo, cl = c.lora, c.cluster
    for name in ("lora_sync_from_tensor", "lora_train_only"):
        if getattr(lo, name) and cl.train_backend == "megatron":
            raise ValueError(f"{name} with train_backend megatron is not supported yet: the Megatron trainer syncs merged "
                             "weights only; use train_backend torch, or drop it")
    if lo.lora_sync_from_tensor and lo.lora_train_only:
        raise ValueError("lora_sync_from_tensor with lora_train_only: lora_train_only keeps the engines on the frozen base, so "
                         "no adapter is synced (as in the reference); drop one")
    if lo.lora_base_cpu_backup:  # the reference's lora_base_cpu_backup_enabled: LoRA, colocate and the flag
        needs = [why for ok, why in ((lo.enabled, "lora_rank > 0"), (cl.colocate, "colocate"),
                                     (lo.lora_sync_from_tensor, "lora_sync_from_tensor (a merged sync re-sends every weight)"),
                                     ("weights" in cl.rollout_offload_tags, "offload_rollout with offload_rollout_level weight "
                                      "(else the engines never release their base)")) if not ok]
        if needs:
            raise ValueError(f"lora_base_cpu_backup keeps a colocated engine's base in host memory across the release of its "
                             f"weights, for adapter-only syncs; it needs {needs[0]}: set it, or drop lora_base_cpu_backup")
    if lo.lora_sync_from_tensor and "weights" in cl.rollout_offload_tags and not lo.lora_base_cpu_backup:
        raise ValueError("lora_sync_from_tensor with colocate: the engines release their weights for each train stage "
                         "(offload_rollout_level weight) and an adapter-only sync does not send the base back; set "
                         "lora_base_cpu_backup (the engines keep the base in host memory), or drop colocate, or "
                         "lora_sync_from_tensor (merged weights)")
    mode = cl.weight_sync_mode
    if lo.lora_sync_from_tensor and cl.rollout_engine == "sglang" and mode != "disk":
        raise ValueError(f"lora_sync_from_tensor with rollout_engine sglang and update_weight_mode {mode}: SGLang 0.5.23's "
                         "/load_lora_adapter_from_tensors takes serialized_named_tensors (MultiprocessingSerializer payloads "
                         "of in-process handles), which cannot cross HTTP; set update_weight_mode: disk (the adapter dir, "
                         "SGLang's /load_lora_adapter), or use rollout_engine hf, or drop lora_sync_from_tensor")
    if lo.lora_sync_from_tensor and cl.update_weight_mode == "broadcast":
        raise ValueError("lora_sync_from_tensor with update_weight_mode broadcast is not supported yet: SGLang 0.5.23 has no "
                         "route that loads an adapter from a process group (the reference's load_lora_adapter_from_"
                         "distributed is a patched SGLang's); the adapter travels as tensors (update_weight_mode tensor or "
                         "unset) or as a PEFT dir (update_weight_mode disk)")
    if c.misc.check_lora_weight_equal and not lo.lora_sync_from_tensor:
        raise ValueError("check_lora_weight_equal checks adapter syncs, and without lora_sync_from_tensor the engines get the "
                         "merged weights: set lora_sync_from_tensor, or use check_weight_update_equal (merged weights)")
    if c.misc.check_lora_weight_equal and cl.runtime == "ray" and mode == "disk":
        raise ValueError("check_lora_weight_equal with update_weight_mode disk is not supported yet: SGLang 0.5.23's "
                         "/load_lora_adapter (LoadLoRAAdapterReqInput) carries no expected_checksums, only "
                         "/load_lora_adapter_from_tensors does; use update_weight_mode tensor with rollout_engine hf, or drop it")
    taken = sorted(set(LORA_SERVER_ARGS) & set(c.sglang.sglang_server_args))
    if lo.lora_sync_from_tensor and cl.rollout_engine == "sglang" and taken:
        raise ValueError(f"sglang_{taken[0]}: with lora_sync_from_tensor miles launches SGLang with its LoRA arguments "
                         f"({', '.join(LORA_SERVER_ARGS)}) from lora_rank and target_modules; drop the sglang_* keys")

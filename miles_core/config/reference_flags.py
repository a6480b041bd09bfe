"""The reference system's flags (reference/flags.tsv, its own argparse registrations) and where each one stands
here. One table, used three ways: the loader maps an alias to our field and refuses a reference flag we do not
have with its reason (instead of "unknown key"); ``docs/reference/compat.md`` is generated from it; a test
checks every flag of the list has an entry.

Status of a flag (``flag_status``), first match wins (so no row of the tables below names one of our fields:
it would never be reached; tested):
- ``same``: a config field of ours with the reference's name (one of ``rules.NOT_SUPPORTED`` is ``unsupported``
  with that table's reason: it is refused at load when set);
- ``alias``: the reference's name for one of our fields (``ALIASES``), accepted and renamed at load;
- ``backend``: an option of a backend (Megatron, SGLang, LoRA, multi-turn) that ours does not implement yet (LoRA:
  the multi-LoRA flags), by group or by flag (``BACKEND_GROUPS``, ``BACKEND_FLAGS``);
- ``unsupported``: not supported yet, with the reason (``UNSUPPORTED_FLAGS``, else ``UNSUPPORTED_GROUPS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .rules import NOT_SUPPORTED

FLAGS_TSV = Path(__file__).resolve().parent / "reference" / "flags.tsv"

ALIASES: dict[str, str] = {"save_hf": "export"}  # reference name -> our field

MEGATRON, SGLANG, LORA, MULTI_TURN = "Megatron", "SGLang", "LoRA", "multi-turn"
BACKEND_STATE: dict[str, str] = {  # how the refusal of a backend flag says where that backend stands
    MEGATRON: "the megatron trainer does not implement it", SGLANG: "miles' SGLang engines and router do not implement it",
    LORA: "miles trains one LoRA adapter (lora_rank); multi-LoRA is a later issue", MULTI_TURN: "the multi-turn loop (custom_generate_function_path) does not implement it",
}
BACKEND_GROUPS: dict[str, str] = {
    "lora": LORA, "sglang": SGLANG, "sglang_router": SGLANG, "router": SGLANG, "prefill_decode_disaggregation": SGLANG,
    "session": MULTI_TURN, "custom_megatron_plugins": MEGATRON, "mtp_training": MEGATRON, "miles": SGLANG, "": MULTI_TURN,
}
BACKEND_FLAGS: dict[str, str] = {
    **dict.fromkeys(["qkv_format", "linear_attention_backend", "miles_dsa_topk_backend", "dsa_attention_backend",
                     "megatron_to_hf_mode", "extra_high_precision_layers_megatron", "extra_high_precision_layers_hf",
                     "custom_model_provider_path", "recompute_loss_function", "allgather_cp", "indep_dp",
                     "delay_split_train_data_by_dp", "rematerialize_param_from_master_weight",
                     "check_rematerialize_param_from_master_weight", "low_memory_resume", "stream_optimizer_state_to_disk", "stream_optimizer_state_moment_dtype",
                     "offload_train_disk_chunk_mb", "use_routing_replay", "use_rollout_routing_replay",
                     "use_indexer_replay", "use_rollout_indexer_replay", "freeze_indexer", "custom_megatron_post_save_hook_path",
                     "ref_ckpt_step", "async_save", "critic_num_nodes", "critic_num_gpus_per_node", "balance_by_flops"],
                    MEGATRON),
}
UNSUPPORTED_GROUPS: dict[str, str] = {
    "wandb": "this W&B option is not implemented by the W&B mirror (miles_core/tracking/wandb_tracker.py)",
    "tensorboard": "the TensorBoard writer reads use_tensorboard and tensorboard_dir; this naming option is not wired yet",
    "prometheus": "the Prometheus exporter reads use_prometheus and prometheus_port; this option is not wired yet",
    "dashboard": "the reference's dashboard is not part of miles (MLflow and Prefect UIs instead)",
    "debug": "the reference's debugging dumps and checkers are not implemented",
    "ci": "the reference's CI harness flags; our tests are the CI",
    "rollout_buffer": "no external rollout-buffer service",
    "reward_model": "no custom sample-to-train-data conversion hook",
    "network": "no proxy / distributed POST options",
    "fault_tolerance": "only use_fault_tolerance with the health monitor is implemented",
    "on_policy_distillation": "this OPD option is not implemented",
    "algo": "this algorithm option is not implemented in the torch trainer yet",
    "rollout": "this rollout option is not implemented yet",
    "data": "this data option is not implemented yet",
    "eval": "this eval option is not implemented yet",
    "train": "this trainer option is not implemented yet",
    "cluster": "this cluster option is not implemented yet",
    "mlflow": "MLflow runs are chosen by the run dir (resume) and mlflow_new_run",
}
UNSUPPORTED_FLAGS: dict[str, str] = {
    "offload": "colocate offloads the engine; trainer offload needs the Megatron backend",
    "num_gpus_per_node": "placement reads actor_num_gpus_per_node and rollout_num_gpus",
    "fully_async": "use async_mode: fully",
    "rollout_function_path": "a whole-rollout function is not supported; custom_generate_function_path replaces the per-sample "
                             "generation (docs/guide/multi-turn.md)",
    "model_name": "the model comes from hf_checkpoint",
    "use_mlflow": "MLflow is always on (the primary tracker)",
    "distributed_backend": "the collectives' backend follows device: NCCL with cuda, gloo with cpu",
    "wandb_key": "the W&B key comes from the environment only (WANDB_API_KEY, or `wandb login`): a config value would be "
                 "written into the MLflow params, the W&B config and the Prefect run form",
    "disable_wandb_random_suffix": "miles never adds the reference's random suffix: the W&B group is wandb_group and the run is "
                                   "named after the MLflow run, what the reference does with this flag (`miles recipe import` "
                                   "accepts it)",
    "wandb_always_use_train_step": "every key is plotted against its own step axis (rollout/step, train/step, eval/step), the "
                                   "reference's default; one train-step axis for all is not implemented",
    "mlflow_run_id": "a run re-attaches to its own MLflow run from the checkpoint; mlflow_new_run starts another",
    "chat_template_path": "apply_chat_template uses the tokenizer's own template",
    "start_rollout_id": "the start comes from the latest checkpoint",
    "critic_load": "the critic is saved and loaded with the actor's checkpoint (extra/critic.safetensors)",
    "critic_save": "the critic is saved with the actor's checkpoint (extra/critic.safetensors)",
    "use_rollout_entropy": "the entropy is computed by the trainer's forward (train/entropy_loss)",
    "log_correct_samples": "the rollout/correct_* metrics are not computed",
    "log_passrate": "passrate/pass@k is always logged with n_samples_per_prompt > 1",
    "debug_rollout_only": "no rollout-only mode yet",
    "debug_train_only": "no train-only mode yet",
    "save_debug_rollout_data": "rollouts are always saved as <run_dir>/rollouts/<id>.pt",
    "load_debug_rollout_data": "a run reuses its own <run_dir>/rollouts/<id>.pt; loading another run's is not supported",
    "eval_tool_key": "no tool calls in eval",
    "eval_min_new_tokens": "no minimum response length",
    **dict.fromkeys(["update_weight_disk_dir", "update_weight_local_checkpoint_dir", "update_weight_delta_encoding",
                     "update_weight_delta_checksum", "custom_update_weight_post_write_path"],
                    "it applies only to update_weight_transfer_mode disk-delta, refused: its engines apply deltas with a "
                    "/pull_weights route that SGLang 0.5.23 does not serve; update_weight_mode disk reloads a full HF dir "
                    "under <run_dir>/weight_sync instead"),
    **dict.fromkeys(["p2p_transfer_num_workers", "p2p_transfer_timeout"],
                    "it applies only to update_weight_transfer_mode p2p, refused: miles builds no Mooncake transfer engine; "
                    "use update_weight_transfer_mode broadcast (a gloo/NCCL group) or update_weight_mode disk"),
    **dict.fromkeys(["eval_num_gpus", "eval_num_gpus_per_engine"],
                    "a dedicated eval engine fleet (the reference's EvalFleet, miles/ray/rollout/eval_fleet.py) is not built: "
                    "eval runs on the rollout engines (eval_mode inline), or, on the local runtime, eval_mode snapshot scores "
                    "each HF snapshot on an engine of its own"),
    **dict.fromkeys(["opd_teacher_urls", "opd_teacher_key"],
                    "per-sample teacher routing is not built: opd_type sglang scores every sample with the one teacher of "
                    "opd_teacher_load (an engine miles starts); the reference posts prefill-only /generate requests to "
                    "name=url teachers chosen by sample.metadata[opd_teacher_key]"),
    **dict.fromkeys(["opd_log_prob_top_k", "opd_top_k_strategy", "opd_topk_per_position"],
                    "top-k distillation is not built: OPD uses the teacher's log-prob of each sampled token only "
                    "(A -= opd_kl_coef * (logp_old - logp_teacher)); the reference's top-k needs SGLang's top_logprobs_num "
                    "and, per position, a patched SGLang (token_ids_logprob_positions)"),
    "sglang_config": "server groups from a YAML (several models or worker types per run) are not built: every engine runs "
                     "the policy with the same sglang_* server arguments",
    "prefill_num_servers": "prefill/decode disaggregation is not built: each engine serves whole requests (SGLang's "
                           "--disaggregation-mode stays null) and miles' router has no prefill/decode pairing",
    "padded_vocab_size": "the megatron trainer derives it (ModelArgs.padded_for: the HF vocab_size rounded up to a "
                         "multiple of tensor_model_parallel_size, the extra rows masked); an explicit size is not read: drop it",
    "no_sglang_lora_use_virtual_experts": "SGLang LoRA on MoE experts is not built: miles syncs merged weights to the "
                                          "engines, never LoRA adapters on virtual experts",
    "use_miles_router": "miles always routes through its own router, which is the reference's MilesRouter (least requests in "
                        "flight, failure quarantine; miles_router_* honoured): the flag is implied, drop it; the SGLang "
                        "router (sglang-router, token-based policies) is not launched",
}
KINDS = ("same", "alias", "backend", "unsupported")


@dataclass(frozen=True)
class FlagStatus:
    flag: str  # the reference's flag, e.g. --rollout-batch-size
    group: str  # the reference's argument group
    default: str  # the reference's default, as written in flags.tsv
    kind: str  # one of KINDS
    field: str | None  # our field (same, alias)
    note: str  # the backend (backend) or the reason (unsupported)


@lru_cache(maxsize=1)
def reference_flags() -> tuple[tuple[str, str, str], ...]:
    """(flag, group, default) of every flag the reference registers itself (flags.tsv)."""
    rows = [line.rstrip("\n").split("\t") for line in FLAGS_TSV.read_text(encoding="utf-8").splitlines()
            if line and not line.startswith("#")]
    return tuple((r[0], r[2], r[4]) for r in rows[1:])


def flag_status(flag: str, group: str, default: str, fields: frozenset[str]) -> FlagStatus:
    """Where the reference flag stands here (module docstring)."""
    name = flag.removeprefix("--").replace("-", "_")
    if name in fields and name in NOT_SUPPORTED:
        return FlagStatus(flag, group, default, "unsupported", None, NOT_SUPPORTED[name])
    if name in fields:
        return FlagStatus(flag, group, default, "same", name, "")
    if name in ALIASES:
        return FlagStatus(flag, group, default, "alias", ALIASES[name], "")
    backend = BACKEND_FLAGS.get(name) or (None if name in UNSUPPORTED_FLAGS else BACKEND_GROUPS.get(group))
    if backend:
        return FlagStatus(flag, group, default, "backend", None, backend)
    reason = UNSUPPORTED_FLAGS.get(name) or UNSUPPORTED_GROUPS.get(group) or "not implemented yet"
    return FlagStatus(flag, group, default, "unsupported", None, reason)


def all_statuses(fields: frozenset[str]) -> list[FlagStatus]:
    return [flag_status(flag, group, default, fields) for flag, group, default in reference_flags()]


def refusal(key: str, fields: frozenset[str]) -> str | None:
    """The message for a config key that is a reference flag we do not have (None if it is not one)."""
    for flag, group, default in reference_flags():
        if flag.removeprefix("--").replace("-", "_") == key:
            s = flag_status(flag, group, default, fields)
            if s.kind == "backend":
                return f"{key} (the reference's {flag}) is a {s.note} option not supported yet: {BACKEND_STATE[s.note]}"
            if s.kind == "unsupported":
                return f"{key} (the reference's {flag}) is not supported yet: {s.note}"
    return None

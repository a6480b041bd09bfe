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
    "miles": SGLANG,
}
BACKEND_FLAGS: dict[str, str] = {}
UNSUPPORTED_GROUPS: dict[str, str] = {
    "wandb": "this W&B option is not implemented by the W&B mirror (miles_core/tracking/wandb_tracker.py)",
    "tensorboard": "the TensorBoard writer reads use_tensorboard and tensorboard_dir; this naming option is not wired yet",
    "prometheus": "the Prometheus exporter reads use_prometheus and prometheus_port; this option is not wired yet",
    "debug": "this debugging option of the reference is not implemented",
    "rollout_buffer": "the reference's external rollout-buffer service (a separate server its buffer rollout function fetches "
                      "trajectories from over HTTP, rollout_buffer_url) has no counterpart: miles generates every rollout "
                      "itself; an agent is a custom_generate_function_path function (docs/guide/multi-turn.md)",
    "session": "the reference's session server (an OpenAI-style chat endpoint that records an agent's turns as token ids, "
               "TITO) is not part of miles: an agent is a custom_generate_function_path function that calls the engine with "
               "token ids itself (docs/guide/multi-turn.md)",
    "on_policy_distillation": "this OPD option is not implemented",
    "algo": "this algorithm option is not implemented in the torch trainer yet",
    "rollout": "this rollout option is not implemented yet",
    "data": "this data option is not implemented yet",
    "eval": "this eval option is not implemented yet",
    "train": "this trainer option is not implemented yet",
    "cluster": "this cluster option is not implemented yet",
    "mlflow": "MLflow runs are chosen by the run dir (resume) and mlflow_new_run",
}
DSA = ("miles' model specs (training/megatron/model_args.py, from config.json) have no DeepSeek Sparse Attention "
       "(the glm_moe_dsa / DeepSeek-V3.2 lightning indexer)")
MOE_REPLAY = ("MoE routing replay (the router's expert choices recorded in the old-policy forward, or taken from SGLang's "
              "rollout, and replayed in the training forward) is not built: the Megatron trainer's megatron-core 0.16.1 "
              "router (TopKRouter) routes every forward afresh")
# Options of the reference's Megatron trainer that ours (miles_core/training/megatron/, megatron-core 0.16.1) does not have
MEGATRON_REFUSED: dict[str, str] = {
    "custom_model_provider_path": "a reference provider (pre_process, post_process, vp_stage) builds its GPTModel from "
                                  "Megatron-LM's global args (megatron.training.get_args), which megatron-core alone does not "
                                  "have; miles builds the model from the checkpoint's config.json (training/megatron/model.py)",
    "linear_attention_backend": "miles' model specs have no linear-attention (Qwen3-Next gated delta-net) layers to run with "
                                "fla or flashqla",
    "miles_dsa_topk_backend": DSA, "dsa_attention_backend": DSA, "freeze_indexer": DSA, "use_indexer_replay": DSA,
    "use_rollout_indexer_replay": DSA,
    "use_routing_replay": MOE_REPLAY, "use_rollout_routing_replay": MOE_REPLAY,
    "extra_high_precision_layers_megatron": "miles syncs and exports weights unquantized in the model dtype: there is no "
                                            "FP8 Megatron-to-HF quantization to exempt layers from",
    "extra_high_precision_layers_hf": "miles syncs and exports weights unquantized in the model dtype: there is no FP8 "
                                      "Megatron-to-HF quantization to exempt layers from",
    "allgather_cp": "it changes how context parallel splits the sequence; context_parallel_size > 1 is refused (it needs "
                    "Transformer Engine's attention, which the CPU-tested local layer spec lacks)",
    "indep_dp": "the train group is one megatron world of TP * PP * CP * DP ranks (megatron-core's own data parallel); "
                "independent per-replica Megatron instances are not built",
    "delay_split_train_data_by_dp": "every train rank already receives the whole rollout and takes its own rows "
                                    "(training/megatron/parallel.my_rows), the flag's behaviour; the default split before "
                                    "sending is not built",
    "low_memory_resume": "Megatron-LM's optimizer-on-CPU checkpoint load; miles loads torch_dist checkpoints with "
                         "megatron-core 0.16.1's dist_checkpointing.load into the live sharded tensors",
    "train_memory_margin_bytes": "torch_memory_saver's margin when the trainer is offloaded on a GPU; miles does not use "
                                 "torch_memory_saver",
    "true_on_policy_mode": "bitwise-equal log-probs need SGLang's deterministic inference and batch-invariant trainer "
                           "kernels; miles' in-process engine shares the trainer's weights (log-prob difference ~0), not "
                           "its kernels",
    "recompute_logprobs_via_prefill": "SGLang prefill re-scoring of the rollout's log-probs is not built: miles' engines "
                                      "return the decode's log-probs (use_rollout_logprobs off: the trainer rescores)",
    "ref_ckpt_step": "it picks an iteration of a Megatron torch_dist reference checkpoint; ref_load is an HF directory or "
                     "builtin:// name here",
    "critic_num_nodes": "the ppo critic trains in the actor's train ranks (its own stage and optimizer in the same train "
                        "group), not in a Ray group of its own: actor_num_nodes and actor_num_gpus_per_node place both",
    "critic_num_gpus_per_node": "the ppo critic trains in the actor's train ranks (its own stage and optimizer in the same "
                                "train group), not in a Ray group of its own: actor_num_nodes and actor_num_gpus_per_node "
                                "place both",
    "mtp_num_layers": "miles' model specs build no multi-token-prediction block (an HF checkpoint's MTP / nextn layers "
                      "are not loaded)",
    "mtp_loss_scaling_factor": "it scales the MTP loss; miles' model specs build no multi-token-prediction block",
    "enable_mtp_training": "miles' model specs build no multi-token-prediction block (an HF checkpoint's MTP / nextn layers "
                           "are not loaded), so there is nothing to train",
}
GONE_BUFFER = "read by no code of the reference (snapshot 31f1ca96): its external rollout-buffer service is gone there too"
UNSUPPORTED_FLAGS: dict[str, str] = {
    **MEGATRON_REFUSED,
    "num_gpus_per_node": "it places SGLang engines' GPUs within a node (the reference's sglang_engine.py); miles places "
                         "engines by rollout_num_gpus and rollout_num_gpus_per_engine bundles",
    "fully_async": "use async_mode: fully (the reference's train_async.py --fully-async)",
    "custom_async_data_buffer_path": "the reference's DataBuffer class (async put / get on its event loop, built from "
                                     "DataBufferConstructorInput) has no counterpart: the fully-async buffer is the worker's "
                                     "own (miles_core/rollout/fully_async.py); max_weight_staleness, stale_group_policy, "
                                     "fully_async_buffer_groups and dynamic_sampling_filter_path set what its DefaultDataBuffer does",
    "keep_old_actor": "the reference's Megatron actor keeps a copy of the pre-update weights to score old log-probs; both "
                      "trainers here score them before the rollout's optimizer steps (REFERENCE.md section 1), so there is "
                      "no old actor to keep",
    "pin_rollout_manager_to_head": "there is no rollout-manager actor to place: the driver (the flow's process) holds the "
                                   "data source, rewards and rollout files on both runtimes",
    "rollout_submission_granularity": "the fully-async worker submits whole rounds of groups in one engine call "
                                      "(async_max_concurrent_samples sizes them); per-sample or per-group backfill is not built",
    "object_store_backend": "rollouts reach the train ranks as Ray call arguments (Ray's own object store) and rollout files "
                            "(<run_dir>/rollouts/<id>.pt); choosing a store (the reference's ray / mooncake) is not supported",
    "mooncake_store_init_kwargs": "the Mooncake object store is not supported (rollouts go through Ray's own store)",
    "mooncake_replica_num": "the Mooncake object store is not supported (rollouts go through Ray's own store)",
    "multimodal_keys": "no multimodal inputs: prompts are text or chat messages and the engines take token ids only",
    "allow_partial_train_step": "a rollout here always fills its steps exactly (rollout_batch_size * n_samples_per_prompt = "
                                "global_batch_size * num_steps_per_rollout, checked at load; dynamic sampling keeps exactly "
                                "rollout_batch_size groups): there is no trailing partial step to train or drop",
    "custom_convert_samples_to_train_data_path": "the reference's hook returns its train-data dict (tokens, response_lengths, "
                                                 "rewards, loss_masks, ...) that its trainers consume; the trainers here take "
                                                 "Samples, so a ported function's dict has no consumer: "
                                                 "custom_reward_post_process_path reshapes the rewards",
    "custom_agent_function_path": "the reference's agentic_tool_call generate function runs this agent against its session "
                                  "server; here the agent is the custom_generate_function_path function itself "
                                  "(docs/guide/multi-turn.md)",
    "rollout_buffer_url": GONE_BUFFER,
    "fetch_trajectory_retry_times": GONE_BUFFER,
    "min_batch_collection_ratio": GONE_BUFFER,
    "rollout_task_type": GONE_BUFFER,
    "loss_mask_type": "the reference's SFT rollout (miles/rollout/sft_rollout.py) builds loss masks by chat-template family; "
                      "miles' sft_loss trains on the loss mask of generated samples, and that SFT rollout is not built",
    "disable_rollout_trim_samples": "a rollout here always has exactly rollout_batch_size * n_samples_per_prompt samples "
                                    "(checked at load, kept by dynamic sampling): there is nothing to trim to the global batch",
    "use_dynamic_global_batch_size": "the global batch is fixed by the batch invariant (rollout_batch_size * "
                                     "n_samples_per_prompt = global_batch_size * num_steps_per_rollout); one that follows "
                                     "the samples a rollout kept is not supported",
    "max_seq_len": "the reference's session server caps an agent's collected sequence with it; here rollout_max_context_len "
                   "caps prompt + response of every sample",
    "use_mlflow": "MLflow is miles' primary tracker, always on (params, metrics, the checkpoints' run id), so the reference's "
                  "default (off: no MLflow) cannot be honoured; `miles recipe import` accepts --use-mlflow",
    "distributed_backend": "the collectives' backend follows device: NCCL with cuda, gloo with cpu",
    "wandb_key": "the W&B key comes from the environment only (WANDB_API_KEY, or `wandb login`): a config value would be "
                 "written into the MLflow params, the W&B config and the Prefect run form",
    "mlflow_run_id": "the reference's primary process always starts a new MLflow run and writes its id here for its secondary "
                     "processes (mlflow_utils.init_mlflow): an internal channel, not a run to attach to; a miles run re-attaches "
                     "to its own MLflow run from the checkpoint, and mlflow_new_run starts another",
    "opd_teacher_ckpt_step": "the iteration of a Megatron checkpoint dir the reference loads as the teacher (load_checkpoint's "
                             "ckpt_step); opd_teacher_load here is an HF dir or builtin://: export that step (export_interval) "
                             "and point opd_teacher_load at its export",
    # the debug group: what stays refused, by component
    **dict.fromkeys(["enable_witness", "witness_buffer_size"],
                    "the reference's forward/backward witness parameters (Megatron model patches) are not implemented"),
    "ci_ft_test_actions": "the reference's fault-tolerant train cells are not part of miles; fault injection is "
                          "MILES_FAULT_INJECT (miles_core/faults.py) and the engines' /debug/fail",
    "debug_deterministic_collective": "the reference's det_nccl process-group backend is not implemented; the collectives "
                                      "follow device (NCCL with cuda, gloo with cpu)",
    # network and fault tolerance
    "http_proxy": "the reference registers it and no code reads it; miles' HTTP clients (httpx) follow the HTTP(S)_PROXY "
                  "and NO_PROXY environment",
    "use_distributed_post": "the reference's per-node Ray POST actors are not implemented: the driver's router sends every "
                            "request (rollout/http/router.py)",
    "control_server_port": "the reference's fault-tolerance control server (HTTP commands to stop / start train cells and "
                           "engines) is not implemented; a run is stopped with SIGINT and resumed from its checkpoint",
    **dict.fromkeys(["mini_ft_controller_enable", "mini_ft_controller_poll_interval", "mini_ft_controller_resume_delay"],
                    "the reference's mini fault-tolerance controller needs its control server (control_server_port), "
                    "which is not implemented; use_fault_tolerance restarts dead engines and Prefect retries failed stages"),
    **dict.fromkeys(["p2p_transfer_num_workers", "p2p_transfer_timeout"],
                    "it applies only to update_weight_transfer_mode p2p, refused: miles builds no Mooncake transfer engine; "
                    "use update_weight_transfer_mode broadcast (a gloo/NCCL group) or update_weight_mode disk"),
    **dict.fromkeys(["eval_num_gpus", "eval_num_gpus_per_engine"],
                    "a dedicated eval engine fleet (the reference's EvalFleet, miles/ray/rollout/eval_fleet.py) is not built: "
                    "eval runs on the rollout engines (eval_mode inline), or, on the local runtime, eval_mode snapshot scores "
                    "each HF snapshot on an engine of its own"),
    "opd_topk_per_position": "it sends token_ids_logprob_positions (one id list per position), a field of a patched "
                             "SGLang that SGLang 0.5.23's GenerateReqInput does not have (miles_core/rollout/sglang/"
                             "protocol.json); top-k OPD asks a teacher for its log-probs of the union of the sample's "
                             "student top-k ids (token_ids_logprob), which gives the same estimate with a larger answer: drop it",
    "sglang_config": "server groups from a YAML (several models or worker types per run) are not built: every engine runs "
                     "the policy with the same sglang_* server arguments",
    "prefill_num_servers": "prefill/decode disaggregation is not built: each engine serves whole requests (SGLang's "
                           "--disaggregation-mode stays null) and miles' router has no prefill/decode pairing",
    "no_sglang_lora_use_virtual_experts": "it picks how SGLang serves LoRA on MoE experts, and miles trains no expert "
                                          "adapters: the Megatron trainer refuses LoRA on MoE models and the torch trainer "
                                          "targets the decoder's dense linear layers, so an adapter sync never carries one",
    # LoRA (the group's other flags are honoured: config/lora.py); the multi-LoRA service is a later issue
    "experts_shared_outer_loras": "grouped-expert LoRA (gate_up lora_A and down lora_B shared across experts) needs "
                                  "adapters on MoE experts, which neither trainer builds (the Megatron trainer refuses LoRA "
                                  "on MoE models; the torch trainer adapts dense linear layers only)",
    "multi_lora_n_adapters": "miles trains one adapter per run (lora_rank; its engines serve one slot, miles_lora, "
                             "max_loras_per_batch 1): the reference's multi-LoRA service (N adapter slots trained at once, "
                             "registered through its controller's HTTP API, miles/ray/multi_lora) is not built",
    **dict.fromkeys(["multi_lora_adapter", "multi_lora_max_adapter_global_batch_size"],
                    "it registers an adapter of the reference's multi-LoRA service (multi_lora_n_adapters), which is not "
                    "built: one run trains one adapter; start it from a PEFT dir with lora_adapter_path"),
    **dict.fromkeys(["multi_lora_http_server_path", "multi_lora_backend_path", "multi_lora_api_port",
                     "multi_lora_disable_service_mode"],
                    "it configures the reference's multi-LoRA controller (its control-plane HTTP server, adapter backend and "
                    "service mode), which is not built: adapters are not registered at run time; one run trains the one "
                    "adapter its config names"),
    **dict.fromkeys(["multi_lora_idle_poll_s", "multi_lora_max_coalesce_wait_s", "multi_lora_max_empty_wait_s"],
                    "it times the reference's multi-LoRA scheduler (polling for registered adapters, coalescing their "
                    "groups into one batch), which is not built: a run's batches are rollout_batch_size prompts of its "
                    "one adapter"),
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


@lru_cache(maxsize=1)
def own_flags() -> frozenset[str]:
    """The flags the reference adds itself (flags.tsv kind `add`), not the Megatron-LM flags it re-defaults (`reset`)."""
    rows = [line.rstrip("\n").split("\t") for line in FLAGS_TSV.read_text(encoding="utf-8").splitlines()
            if line and not line.startswith("#")]
    return frozenset(r[0] for r in rows[1:] if r[1] == "add")


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

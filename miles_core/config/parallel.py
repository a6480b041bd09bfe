"""Model parallelism, recompute, dynamic batching and train offload (the reference's Megatron-LM names).

Read by ``train_backend: megatron`` (miles_core/training/megatron/). The torch trainer is data parallel
only: a value here other than its default with train_backend torch is refused at load (rules.py), except
data_pad_size_multiplier, which both trainers read.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ._base import Group


class ParallelConfig(Group):
    """Megatron model parallelism (TP, PP, CP, EP), recompute, dynamic batching and train offload."""

    tensor_model_parallel_size: int = Field(1, ge=1, description="Tensor parallel size (TP): each layer's weights split over TP ranks (train_backend megatron).")
    pipeline_model_parallel_size: int = Field(1, ge=1, description="Pipeline parallel size (PP): the layers split into PP stages (train_backend megatron).")
    context_parallel_size: int = Field(1, ge=1, description="Context parallel size (CP): sequences split over CP ranks. Only 1 is supported yet (CP needs Transformer Engine's attention).")
    expert_model_parallel_size: int = Field(1, ge=1, description="Expert parallel size (EP): the MoE experts split over EP ranks (train_backend megatron).")
    expert_tensor_parallel_size: int | None = Field(None, ge=1, description="Tensor parallel size inside each expert (ETP); None = tensor_model_parallel_size.")
    padded_vocab_size: int | None = Field(
        None, ge=1, description="train_backend megatron: rows of the policy's embedding and output layer (>= the model's "
                                "vocab_size, a multiple of tensor_model_parallel_size); the extra rows are zeros, masked out "
                                "of every softmax. Default: vocab_size rounded up to a multiple of the TP size.")
    sequence_parallel: bool = Field(False, description="Split norms and dropout along the sequence over the TP ranks. Not supported yet (needs Transformer Engine norms).")
    recompute_granularity: Literal["full", "selective"] | None = Field(None, description="Activation recompute: full (whole layers) or selective (core attention only); None = off.")
    recompute_method: Literal["uniform", "block"] | None = Field(None, description="With recompute_granularity full: uniform (chunks of recompute_num_layers) or block (the first recompute_num_layers layers of each stage).")
    recompute_num_layers: int | None = Field(None, ge=1, description="Layers per recompute chunk (uniform) or recomputed layers per stage (block).")
    megatron_to_hf_mode: Literal["raw", "bridge"] = Field(
        "raw", description="train_backend megatron: how its weights become HF tensors (weight sync, exports) and back: raw, "
        "miles' own per-family converters (training/megatron/weights.py; the reference's raw mode). bridge (Megatron-Bridge's "
        "AutoBridge) is refused: miles does not install or use Megatron-Bridge.")
    recompute_loss_function: bool = Field(
        False, description="train_backend megatron: compute each micro-batch's loss from the model's output (log-softmax "
        "over the vocab, entropy, loss terms) under activation checkpointing: its activations are recomputed in the "
        "backward instead of kept (less memory, one more loss pass; same loss and gradients).")
    distributed_timeout_minutes: int = Field(10, ge=1, description="train_backend megatron: timeout of the trainer's collectives (megatron-core's model-parallel groups, and the world of the train group: the Ray ranks' or the local runtime's one rank): a rank that waits longer on a collective fails instead of hanging.")
    use_distributed_optimizer: bool = Field(False, description="train_backend megatron: shard the optimizer state (fp32 main parameters, Adam moments) over the data-parallel ranks with megatron-core's distributed optimizer.")
    use_dynamic_batch_size: bool = Field(False, description="train_backend megatron: pack each micro-batch's sequences (THD, no padding) up to max_tokens_per_gpu tokens instead of micro_batch_size samples.")
    balance_by_flops: bool = Field(
        False, description="train_backend megatron, with use_dynamic_batch_size: split each rank's rows into ceil(tokens / "
                           "max_tokens_per_gpu) micro-batches of near-equal estimated forward FLOPs (Karmarkar-Karp; the "
                           "attention's quadratic cost counts) instead of first-fit packing by tokens; as in the reference, "
                           "a micro-batch may then exceed max_tokens_per_gpu. The rows' split over the data-parallel ranks "
                           "is unchanged (balance_data).")
    max_tokens_per_gpu: int | None = Field(None, ge=1, description="Tokens per packed training micro-batch (use_dynamic_batch_size).")
    log_probs_max_tokens_per_gpu: int | None = Field(None, ge=1, description="Tokens per packed forward-only micro-batch (use_dynamic_batch_size); default max_tokens_per_gpu.")
    qkv_format: Literal["thd", "bshd"] = Field(
        "thd", description="Layout of a training or log-prob micro-batch: thd packs its samples into one sequence with "
        "their THD cu_seqlens (no padding; with the local spec a group's samples share their prompt), bshd right-pads "
        "them to [micro_batch_size, longest]. train_backend torch packs its samples by prompt (training/batch.py): bshd "
        "is megatron only, and not with use_dynamic_batch_size (which packs), as in the reference.")
    data_pad_size_multiplier: int = Field(
        128, ge=1, description="Pad each packed training and forward-only batch to a multiple of this many tokens (times "
                               "tensor_model_parallel_size on megatron), as the reference's get_batch: megatron's packed "
                               "micro-batch (thd) with a pad segment of its own, its padded one (bshd) in columns; the torch "
                               "trainer's packed rows (or its padded sequences) widened until they hold a multiple of it "
                               "together. The extra slots are masked out, so no log-prob, loss or gradient changes; 1 = no "
                               "padding.")
    offload_train: bool | None = Field(
        None, description="Move the trainer's state (weights, gradients, optimizer state of every model it holds: policy, "
        "critic, reference, teacher) into host memory while the engines generate: after each weight sync, and back before "
        "the next train stage (or a save or export that needs it). Its device memory is free meanwhile; the numbers are "
        "those of a run without it (the bytes are copied back exactly). None: on with colocate or offload (the "
        "reference's default), off otherwise. Not with async_mode (the engines generate while the trainer trains), "
        "debug_rollout_only (no train stage) or debug_train_only (no engines).")
    offload_train_target: Literal["cpu", "disk"] = Field(
        "cpu", description="Where offload_train puts the trainer's state while the engines generate: cpu, a copy in host "
        "memory; disk, files under offload_train_disk_dir (one per storage, written and read back in chunks of "
        "offload_train_disk_chunk_mb through one staging buffer, removed once read back), for when host memory cannot "
        "hold it either. The numbers are those of a run without offload either way. disk needs offload_train on, and "
        "not rematerialize_param_from_master_weight (as in the reference).")
    offload_train_disk_dir: str | None = Field(
        None, description="The directory of the disk files of offload_train_target disk (<dir>/train_state/rank<r>) and "
        "stream_optimizer_state_to_disk (<dir>/optimizer_state/rank<r>/<actor|critic>); None: <run_dir>/train_offload. "
        "Each process empties its own subtree when the trainer is built (a crashed run's leftovers). Use fast local "
        "disk (a tmpfs keeps the bytes in RAM). Not inside the checkpoint save / load dirs, nor holding them.")
    offload_train_disk_chunk_mb: int = Field(
        256, ge=1, description="Chunk size (MiB) of the moves to and from the disk files: the host staging buffer "
        "(pinned on a GPU), which bounds the host memory used whatever is moved, dropped after each move; "
        "stream_optimizer_state_to_disk also streams the moments through the device in buckets of this many MiB of "
        "fp32 moments. Only with offload_train_target disk or stream_optimizer_state_to_disk.")
    stream_optimizer_state_to_disk: bool = Field(
        False, description="Keep AdamW's moments (exp_avg, exp_avg_sq) in files under offload_train_disk_dir between "
        "optimizer steps, streamed through the device one bucket (offload_train_disk_chunk_mb) at a time around each "
        "step, for when the optimizer state does not fit the device during the step. The torch trainer's actor and "
        "critic; not with train_backend megatron, LoRA, data parallel (more than one train rank), "
        "reset_optimizer_states, or offload_train with offload_train_target cpu (as in the reference).")
    stream_optimizer_state_moment_dtype: Literal["fp32", "bf16", "fp16", "fp8e4m3", "fp8e5m2"] = Field(
        "fp32", description="The on-disk dtype of the streamed moments (a storage format: the step computes in fp32). "
        "fp32 gives the numbers of a run without streaming, bit for bit; bf16 halves the bytes moved and rounds the "
        "moments at each write; fp16 and the fp8 formats have no per-block scaling (a small exp_avg_sq can flush to 0) "
        "and are not recommended. Only with stream_optimizer_state_to_disk.")
    rematerialize_param_from_master_weight: bool = Field(
        False, description="With offload_train on train_backend megatron in 16-bit (dtype bfloat16 or float16, whose "
        "optimizer keeps fp32 main weights): the 16-bit weights of the policy and critic get no host copy while offloaded "
        "(their device memory is freed, the host holds less) and are rebuilt on onload by casting the fp32 main weights "
        "into them, the step's own cast (and the distributed optimizer's all-gather), so the numbers are unchanged. Not "
        "with train_backend torch or dtype float32 (the parameters are the fp32 weights: nothing to rebuild from), nor "
        "with lora_rank > 0.")
    check_rematerialize_param_from_master_weight: bool = Field(
        False, description="With rematerialize_param_from_master_weight: keep a host copy of the 16-bit weights as well "
        "and, on each onload, compare the rebuilt weights with it bit for bit; a difference stops the run naming the "
        "first parameter that differs.")

    # ---- the reference's Megatron plugin hooks (dotted paths; train_backend megatron; miles_core/training/megatron/hooks.py)
    custom_megatron_init_path: str | None = Field(
        None, description="Called as fn(args) once per trainer, after megatron's parallel groups and seeds are set up, "
                          "before any model is built (args: the config under the reference's flag names).")
    custom_megatron_before_log_prob_hook_path: str | None = Field(
        None, description="Called as fn(args, model, store_prefix) before each forward-only pass (model: [the DDP stage], "
                          "in eval mode; store_prefix '' for the policy's old log-probs and the critic's values, 'ref_', "
                          "'teacher_').")
    custom_megatron_before_train_step_hook_path: str | None = Field(
        None, description="Called as fn(args, rollout_id, step_id, model, optimizer, opt_param_scheduler) before each "
                          "optimizer step's forward-backward, gradients zeroed, for the actor and the ppo critic; "
                          "opt_param_scheduler is None (miles sets the learning rate on the param groups).")
    custom_megatron_post_save_hook_path: str | None = Field(
        None, description="Called as fn(args, rollout_id, checkpoint_dir, hf_checkpoint_dir) on rank 0 after each checkpoint "
                          "is complete (checkpoint_dir: <save>/<rollout_id>); hf_checkpoint_dir is None (HF snapshots are "
                          "the export stage's, after the save).")

    @property
    def expert_tp(self) -> int:
        """expert_tensor_parallel_size, defaulting to tensor_model_parallel_size."""
        return self.expert_tensor_parallel_size or self.tensor_model_parallel_size

    @property
    def model_parallel(self) -> int:
        """TP * PP * CP: ranks holding one copy of the model."""
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size * self.context_parallel_size

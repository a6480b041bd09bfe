"""Training backends by ``train_backend``: one builder ``(TrainerContext) -> Trainer`` per config value.

A backend's heavy imports (megatron.core) load inside its builder, so the default path never pays them.
Which placement runs which backend: miles_core/config/backends.py (checked at config load).
"""

from __future__ import annotations

from typing import Callable

import torch

from .protocol import Trainer, TrainerContext


def build_torch_trainer(ctx: TrainerContext) -> Trainer:
    """The policy (seeded by ``seed``), reference (KL) and teacher (OPD) models, on ``device``, in a TorchEngine
    under its parallel strategy, and the RL step over it (TorchTrainer)."""
    from miles_core.checkpoint.hf_load import load_hf_model

    from miles_core.device import resolve_device
    from miles_core.env import cache_dir
    from miles_core.models import resolve_model_path

    from .precision import Precision
    from .profiler import TrainProfiler
    from .lora import adapters_of
    from .teacher import load_teacher
    from .torch_trainer import TorchTrainer

    cfg = ctx.cfg
    torch.manual_seed(cfg.misc.seed)
    device = resolve_device(cfg.cluster.device)
    profiler = TrainProfiler.of(cfg, rank=ctx.rank)  # before the models load: record_memory_history sees them allocated
    precision = Precision.of(cfg.misc.dtype, device)
    dtype = precision.model_dtype  # forward-only models; the trained ones keep main weights (training/precision.py)
    policy = load_hf_model(ctx.model_path, dtype=precision.main_dtype).to(device)  # the critic (ppo) follows it
    ref = None
    if cfg.needs_ref_model:
        ref_path = resolve_model_path(cfg.checkpoint.ref_load, cache_dir()) if cfg.checkpoint.ref_load else ctx.model_path
        ref = load_hf_model(ref_path, dtype=dtype).to(device).eval()
    teacher = load_teacher(cfg, dtype, policy.config.vocab_size, make_engine=ctx.make_engine, device=device)
    return TorchTrainer(policy, cfg, pad_id=ctx.tokenizer.pad_token_id, ref_model=ref, teacher=teacher, parallel=parallel_of(ctx),
                        lora=adapters_of(cfg.lora, cfg.checkpoint.hf_checkpoint), profiler=profiler)


def parallel_of(ctx: TrainerContext):
    """The torch engine's parallel strategy: one rank of a train group runs FSDP2 data parallel over the group's
    process group (data_parallel.py), one process the do-nothing SingleProcess."""
    from .data_parallel import FSDPDataParallel, SingleProcess

    return FSDPDataParallel(ctx.rank, ctx.world_size, ctx.cfg.cluster.balance_data) if ctx.world_size > 1 else SingleProcess()


def build_megatron_trainer(ctx: TrainerContext) -> Trainer:
    """The RL step over megatron-core's engine (training/megatron/), imported only here."""
    from .megatron import build_megatron_trainer as build

    return build(ctx)


TRAINERS: dict[str, Callable[[TrainerContext], Trainer]] = {
    "torch": build_torch_trainer,
    "megatron": build_megatron_trainer,
}

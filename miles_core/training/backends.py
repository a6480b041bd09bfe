"""Training backends by ``train_backend``: one builder ``(TrainerContext) -> Trainer`` per config value.

A backend's heavy imports (megatron.core) load inside its builder, so the default path never pays them.
Which placement runs which backend: miles_core/config/backends.py (checked at config load).
"""

from __future__ import annotations

from typing import Callable

import torch

from .protocol import Trainer, TrainerContext


def build_torch_trainer(ctx: TrainerContext) -> Trainer:
    """The policy (seeded by ``seed``), reference (KL) and teacher (OPD) models, on ``device``, and the TorchTrainer."""
    from transformers import AutoModelForCausalLM

    from miles_core.device import resolve_device
    from miles_core.env import cache_dir
    from miles_core.models import resolve_model_path

    from .teacher import load_teacher
    from .torch_trainer import TorchTrainer

    cfg = ctx.cfg
    torch.manual_seed(cfg.misc.seed)
    dtype, device = getattr(torch, cfg.misc.dtype), resolve_device(cfg.cluster.device)
    policy = AutoModelForCausalLM.from_pretrained(ctx.model_path, dtype=dtype).to(device)  # the critic (ppo) follows it
    ref = None
    if cfg.needs_ref_model:
        ref_path = resolve_model_path(cfg.checkpoint.ref_load, cache_dir()) if cfg.checkpoint.ref_load else ctx.model_path
        ref = AutoModelForCausalLM.from_pretrained(ref_path, dtype=dtype).to(device).eval()
    teacher = load_teacher(cfg, dtype, policy.config.vocab_size, make_engine=ctx.make_engine, device=device)
    trainer = TorchTrainer(policy, cfg, pad_id=ctx.tokenizer.pad_token_id, ref_model=ref, teacher=teacher)
    if ctx.world_size > 1:  # one rank of a train group: FSDP2 data parallel over the group's process group
        from .data_parallel import FSDPDataParallel

        FSDPDataParallel(ctx.rank, ctx.world_size, cfg.cluster.balance_data).attach(trainer)
    return trainer


def build_megatron_trainer(ctx: TrainerContext) -> Trainer:
    """megatron-core's trainer (training/megatron/), imported only here."""
    from .megatron import build_megatron_trainer as build

    return build(ctx)


TRAINERS: dict[str, Callable[[TrainerContext], Trainer]] = {
    "torch": build_torch_trainer,
    "megatron": build_megatron_trainer,
}

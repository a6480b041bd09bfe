"""The Megatron-core training backend (``train_backend: megatron``): megatron imported lazily, here only.

    build_megatron_trainer(ctx) -> MegatronTrainer   the builder the runtime's TRAINERS table names

The process group: on the Ray runtime each train-group actor calls the builder after
``torch.distributed.init_process_group`` (gloo on CPU, NCCL on GPU) with its rank; world =
TP * PP * CP * DP. In the local runtime (rank 0 of 1) the builder starts a one-process gloo group
itself. ``MegatronTrainer.close()`` destroys megatron's groups (and that one-process group).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from miles_core.training.protocol import TrainerContext

    from .trainer import MegatronTrainer


# megatron-core warns, once per module, that it falls back to torch ops without Transformer Engine / Apex: the local
# layer spec this backend builds on CPU (and chooses on GPU without TE) is that fallback, so the lines say nothing new.
EXPECTED_WARNINGS = (r"Transformer Engine and Apex are not installed", r"Apex is not installed")


def build_megatron_trainer(ctx: "TrainerContext") -> "MegatronTrainer":
    import warnings

    import torch.distributed as dist

    for text in EXPECTED_WARNINGS:
        warnings.filterwarnings("ignore", message=text, category=UserWarning)
    from .trainer import MegatronTrainer

    if dist.is_initialized() and (dist.get_rank(), dist.get_world_size()) != (ctx.rank, ctx.world_size):
        raise RuntimeError(f"TrainerContext says rank {ctx.rank} of {ctx.world_size}, torch.distributed says "
                           f"{dist.get_rank()} of {dist.get_world_size()}")
    pad_id = getattr(ctx.tokenizer, "pad_token_id", None)
    return MegatronTrainer(ctx.cfg, ctx.model_path, pad_id=0 if pad_id is None else pad_id)

"""The Megatron trainer's optimizer step: AdamW over this rank's parameter shards, with the gradient norm
taken over the whole model (torch's clip_grad_norm_ semantics: clip coefficient max_norm / (norm + 1e-6),
at most 1).

Gradients are megatron DDP's (``param.main_grad``, already summed over data-parallel ranks, tied
embeddings and sequence-parallel norms reduced by finalize_model_grads). The norm counts each parameter
once: a TP-replicated one (norms, routers) on TP rank 0 only, the pipeline's copy of tied embeddings
not at all; squares are summed over the model-parallel group for dense parameters and over the
expert-model-parallel group for experts. The step is torch's AdamW (fused on CPU), the torch
trainer's optimizer.

With use_distributed_optimizer it is megatron-core's DistributedOptimizer instead (ZeRO-1): DDP
reduce-scatters the gradients so each data-parallel rank holds its shard of the flat gradient buffer,
the rank's AdamW steps only the fp32 main-parameter shard it owns (its optimizer state is that shard's),
and the updated shards are all-gathered back into every rank's parameters. Its grad norm and clip are
megatron's (clip_grads.get_grad_norm_fp32: the same norm, squares summed over the model-parallel and
data-parallel shards; coefficient max_norm / (norm + 1e-6)); every parameter is weight-decayed, as here.

16-bit parameters (dtype bfloat16 or float16) always take megatron-core's mixed-precision optimizer, as the
reference does: ``get_megatron_optimizer(OptimizerConfig(bf16=True | fp16=True, ...))``, which is
``Float16OptimizerWithFloat16Params`` without the distributed optimizer (an fp32 main copy of every 16-bit
parameter, optimizer/optimizer.py) and the ``DistributedOptimizer`` with it (fp32 main shards): DDP
accumulates and reduces the gradients in fp32 buffers (grad_reduce_in_fp32), the gradients are copied to
the fp32 main parameters, AdamW steps those, and the 16-bit parameters are copied back from them. float16
adds megatron's dynamic loss scaler (the schedule scales the loss through ``grad_scale_func``; a step whose
gradients overflow is skipped, its grad norm nan). Checkpoints hold the fp32 main weights (the optimizer's
sharded state: ``fp32_from_fp16_params`` / the distributed optimizer's ``fp32_param``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist


def _counted(p: torch.nn.Parameter) -> bool:
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    return param_is_not_tensor_parallel_duplicate(p) and not getattr(p, "shared", False)


def use_main_grads(params: list[torch.nn.Parameter]) -> None:
    """p.grad = p.main_grad (in p's dtype) for the optimizer."""
    for p in params:
        grad = getattr(p, "main_grad", None)
        p.grad = None if grad is None else (grad if grad.dtype == p.dtype else grad.to(p.dtype))


def grad_norm(params: list[torch.nn.Parameter]) -> float:
    """The global L2 norm of the gradients of the whole model (see the module docstring)."""
    from megatron.core import parallel_state as ps

    from .parallel import comm_device

    dense = torch.zeros((), dtype=torch.float64, device=comm_device())
    expert = torch.zeros((), dtype=torch.float64, device=comm_device())
    for p in params:
        if p.grad is not None and _counted(p):
            sq = p.grad.detach().double().pow(2).sum()
            if getattr(p, "allreduce", True):
                dense += sq
            else:
                expert += sq
    if dist.get_world_size() > 1:
        dist.all_reduce(dense, group=ps.get_model_parallel_group())
        dist.all_reduce(expert, group=ps.get_expert_tensor_model_pipeline_parallel_group())
    return math.sqrt(float(dense + expert))


def clip_(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Scale the gradients so their global norm is at most max_norm (0 = no clip); -> the norm before."""
    norm = grad_norm(params)
    if max_norm > 0:
        coef = min(max_norm / (norm + 1e-6), 1.0)
        if coef < 1.0:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef)
    return norm


def wrap_ddp(tconfig, stage, distributed_optimizer: bool = False):
    """stage in megatron's DistributedDataParallel (fp32 gradient buffers); tconfig (stage's own) gets the
    schedule's hooks: finalize_model_grads without megatron's division by the token count (the Reducer's
    denominators already make the loss the step's mean) and this DDP's no_sync."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads

    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=distributed_optimizer)
    ddp = DistributedDataParallel(tconfig, ddp_config, stage)
    tconfig.finalize_model_grads_func = lambda chunks, num_tokens=None, **kwargs: finalize_model_grads(chunks, None, **kwargs)
    tconfig.no_sync_func = ddp.no_sync
    return ddp


HALF = (torch.bfloat16, torch.float16)


def build(ddp, params: list[torch.nn.Parameter], algo, lr: float, dtype: torch.dtype, distributed: bool, device: str):
    """The optimizer of ddp's parameters: megatron-core's (16-bit parameters or use_distributed_optimizer), else torch's
    AdamW on the fp32 parameters (see the module docstring). The schedule's loss scaling is wired to it."""
    if not distributed and dtype not in HALF:
        return adamw(params, algo, lr, device)
    optimizer = megatron_adamw(ddp, algo, lr, dtype, distributed)
    ddp.config.grad_scale_func = optimizer.scale_loss  # 1 under bf16; the dynamic loss scale under fp16
    return optimizer


def adamw(params: list[torch.nn.Parameter], algo, lr: float, device: str) -> torch.optim.Optimizer:
    """torch's AdamW with the run's betas, eps and weight decay (fused on cpu and cuda)."""
    return torch.optim.AdamW(params, lr=lr, betas=(algo.adam_beta1, algo.adam_beta2), eps=algo.adam_eps,
                             weight_decay=algo.weight_decay, fused=device in ("cpu", "cuda"))


def megatron_adamw(ddp, algo, lr: float, dtype: torch.dtype, distributed: bool):
    """megatron-core's optimizer (torch AdamW inside; fp32 main weights for 16-bit parameters) over ddp."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    config = OptimizerConfig(optimizer="adam", lr=lr, weight_decay=algo.weight_decay, adam_beta1=algo.adam_beta1,
                             adam_beta2=algo.adam_beta2, adam_eps=algo.adam_eps, clip_grad=algo.clip_grad,
                             use_distributed_optimizer=distributed, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
                             params_dtype=dtype)
    return get_megatron_optimizer(config, [ddp], config_overrides={})  # {}: no weight-decay exemptions


def main_params(optimizer) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """(model parameter, its fp32 main weights) of a megatron optimizer: the Float16Optimizer's fp32 copies, or this
    rank's fp32 main shards of the distributed optimizer (flat); fp32 parameters are their own main weights."""
    out = []
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if hasattr(opt, "shard_fp32_from_float16_groups"):  # DistributedOptimizer
            pairs = [(opt.model_float16_groups, opt.shard_fp32_from_float16_groups),
                     (opt.model_fp32_groups, opt.shard_fp32_groups)]
        else:  # Float16OptimizerWithFloat16Params
            pairs = [(opt.float16_groups, opt.fp32_from_float16_groups), (opt.fp32_from_fp32_groups, opt.fp32_from_fp32_groups)]
        for models, mains in pairs:
            for model_group, main_group in zip(models, mains):
                out.extend(zip(model_group, main_group))
    return out


def grad_buffers(ddp) -> list:
    """megatron DDP's contiguous grad (and, with the distributed optimizer, param) buffers, dense and expert; [] for a
    module that is not megatron's DDP."""
    lists = (getattr(ddp, name, None) for name in ("buffers", "expert_parallel_buffers"))
    return [b for found in lists if isinstance(found, list) for b in found]


def megatron_step(optimizer, max_norm: float, check: Callable[[float], None]) -> float:
    """One step of megatron's optimizer: gradients to the fp32 main weights (unscaled, checked for overflow under
    fp16), megatron's norm (and clip when max_norm > 0), AdamW on the main weights (this rank's shard), copied back
    into the parameters (all-gathered), ``check`` of the norm first; -> the norm before clipping (nan: an fp16 overflow, the step skipped)."""
    if optimizer.prepare_grads():  # found inf/nan: the loss scaler has lowered its scale, no update (as megatron's step)
        return math.nan
    norm = optimizer.clip_grad_norm(max_norm) if max_norm > 0 else optimizer.get_grad_norm()
    check(float(norm))
    optimizer.step_with_ready_grads()
    return float(norm)


def step(optimizer, params: list[torch.nn.Parameter], max_norm: float, check: Callable[[float], None]) -> float:
    """One optimizer step of the gradients DDP holds, clipped to max_norm (0 = no clip); ``check(norm)`` (the
    NaN/inf guard, miles_core/finite.py) runs before the update; -> the norm before."""
    if hasattr(optimizer, "prepare_grads"):  # megatron's optimizer (Float16 or distributed)
        return megatron_step(optimizer, max_norm, check)
    use_main_grads(params)
    norm = clip_(params, max_norm)
    check(norm)
    optimizer.step()
    return norm

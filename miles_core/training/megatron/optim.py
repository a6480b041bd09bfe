"""The Megatron trainer's optimizer step: AdamW over this rank's parameter shards, with the gradient norm
taken over the whole model (torch's clip_grad_norm_ semantics: clip coefficient max_norm / (norm + 1e-6),
at most 1).

Gradients are megatron DDP's (``param.main_grad``, already summed over data-parallel ranks, tied
embeddings and sequence-parallel norms reduced by finalize_model_grads). The norm counts each parameter
once: a TP-replicated one (norms, routers) on TP rank 0 only, the pipeline's copy of tied embeddings
not at all; squares are summed over the model-parallel group for dense parameters and over the
expert-model-parallel group for experts. megatron's own optimizer wrappers hard-code CUDA tensors, so
the step is torch's AdamW (fused on CPU), the torch trainer's optimizer.
"""

from __future__ import annotations

import math

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

    dense = torch.zeros((), dtype=torch.float64)
    expert = torch.zeros((), dtype=torch.float64)
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


def wrap_ddp(tconfig, stage):
    """stage in megatron's DistributedDataParallel (fp32 gradient buffers); tconfig (stage's own) gets the
    schedule's hooks: finalize_model_grads without megatron's division by the token count (the Reducer's
    denominators already make the loss the step's mean) and this DDP's no_sync."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads

    ddp = DistributedDataParallel(tconfig, DistributedDataParallelConfig(grad_reduce_in_fp32=True), stage)
    tconfig.finalize_model_grads_func = lambda chunks, num_tokens=None, **kwargs: finalize_model_grads(chunks, None, **kwargs)
    tconfig.no_sync_func = ddp.no_sync
    return ddp


def adamw(params: list[torch.nn.Parameter], algo, lr: float, device: str) -> torch.optim.Optimizer:
    """torch's AdamW with the run's betas, eps and weight decay (fused on cpu and cuda)."""
    return torch.optim.AdamW(params, lr=lr, betas=(algo.adam_beta1, algo.adam_beta2), eps=algo.adam_eps,
                             weight_decay=algo.weight_decay, fused=device in ("cpu", "cuda"))

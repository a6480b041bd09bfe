"""The LM head by vocabulary chunks on the CPU.

One fp32 ``x @ W.T`` over a large vocabulary runs far below the matmul peak on the CPU: at SmolLM2-135M's head
(49152 x 576), one torch thread, 16 decode rows run at 27 GFLOP/s and a 512-token training batch at 58, against
75-78 for the model's layers; the same products over 2048-row slices of W, written into one output, run at 38
and 65-70, and the weight gradient (``g.T @ x``) likewise 54 -> 63-64 (docs/performance.md, "What makes a step cheaper").
``lm_head`` takes that path for a plain fp32 ``nn.Linear`` head on the CPU outside autocast and calls the module
otherwise (CUDA, bf16, autocast, LoRA or other wrappers, a bias): the same function, values equal up to float
rounding (tests/models/test_lm_head.py).
"""

from __future__ import annotations

import torch

CHUNK = 2048  # vocabulary rows per product (measured best of 512-4096 at 16-1024 rows)


def lm_head(head: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """head(x) for x [..., H] -> [..., V]."""
    if not _chunkable(head, x):
        return head(x)
    flat = x.reshape(-1, x.shape[-1])
    if torch.is_grad_enabled() and (x.requires_grad or head.weight.requires_grad):
        out = _ChunkedLinear.apply(flat, head.weight)
    else:
        out = _forward(flat, head.weight)
    return out.view(*x.shape[:-1], head.weight.shape[0])


def _chunkable(head: torch.nn.Module, x: torch.Tensor) -> bool:
    w = getattr(head, "weight", None)
    return (type(head) is torch.nn.Linear and head.bias is None and x.device.type == "cpu" and w.device.type == "cpu"
            and x.dtype == w.dtype == torch.float32 and w.shape[0] > CHUNK and not torch.is_autocast_enabled("cpu"))


def _forward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = x.new_empty((x.shape[0], w.shape[0]))
    for s in range(0, w.shape[0], CHUNK):
        torch.mm(x, w[s : s + CHUNK].t(), out=out[:, s : s + CHUNK])
    return out


class _ChunkedLinear(torch.autograd.Function):
    """x [M, H] @ w[V, H].T by vocabulary chunks; backward: dx = g @ w (one product, already at the peak), dw by
    the same chunks (dw[s:e] = g[:, s:e].T @ x)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return _forward(x, w)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, w = ctx.saved_tensors
        dx = g @ w if ctx.needs_input_grad[0] else None
        dw = None
        if ctx.needs_input_grad[1]:
            dw = torch.empty_like(w)
            for s in range(0, w.shape[0], CHUNK):
                torch.mm(g[:, s : s + CHUNK].t(), x, out=dw[s : s + CHUNK])
        return dx, dw

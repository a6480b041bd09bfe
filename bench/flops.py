"""FLOP accounting: the measured fp32 matmul peak of this CPU and the model FLOPs of a training step.

Peak: the best median FLOP/s of square fp32 matmuls (n x n @ n x n, 2 n^3 FLOPs) over a few sizes, at
the current torch thread count: the most this machine sustains on the kernel the model spends its
time in. MFU = achieved model FLOP/s / that peak.

Model FLOPs (the usual accounting, useful work only: real tokens, no padding, no recompute):
    forward per token  = 2 * P_matmul + 4 * n_layers * hidden * ctx / 2      (causal attention, mean context)
    train step         = 3 * forward (forward + backward), plus 1 * forward for an old-log-prob pass
P_matmul counts every weight used in a matmul per token: all Linear layers plus the LM head (the
embedding lookup is not a matmul; with tied embeddings the LM head still is).
"""

from __future__ import annotations

import statistics
import time

import torch

from .common import Result, table


def matmul_flops_per_s(n: int, repeats: int) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)


def measure_peak(sizes: tuple[int, ...] = (512, 1024, 2048), repeats: int = 10) -> dict:
    per_size = {n: matmul_flops_per_s(n, repeats if n < 2048 else max(3, repeats // 3)) for n in sizes}
    return {"peak_flops_per_s": max(per_size.values()), "by_size": {str(n): v for n, v in per_size.items()},
            "threads": torch.get_num_threads(), "dtype": "float32"}


def matmul_params(model) -> int:
    """Weights used in a matmul per token: Linear layers + the LM head (counted even when tied)."""
    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    head = model.get_output_embeddings()
    if head is not None and not isinstance(head, torch.nn.Linear):
        n += head.weight.numel()
    return n


def forward_flops_per_token(model, mean_context: float) -> float:
    c = model.config
    return 2 * matmul_params(model) + 4 * c.num_hidden_layers * c.hidden_size * mean_context


def head_params(model) -> int:
    head = model.get_output_embeddings()
    return head.weight.numel() if head is not None else 0


def packed_train_flops(model, groups: list[tuple[int, list[int]]], old_pass: bool) -> float:
    """Model FLOPs of one training step as the packed trainer computes it (training/batch.py
    ``response_logits``): each group's shared prompt once (p tokens), each response after it (r tokens,
    seeing the prompt and itself), the LM head only at response positions. groups: (p, [r, ...])."""
    c = model.config
    body = 2 * (matmul_params(model) - head_params(model))
    head = 2 * head_params(model)
    attn = 4 * c.num_hidden_layers * c.hidden_size  # x mean context
    total = 0.0
    for p, responses in groups:
        total += p * (body + attn * p / 2)
        total += sum(r * (body + head + attn * (p + r / 2)) for r in responses)
    return total * (3 + (1 if old_pass else 0))


def train_flops(model, seqs: list[int], old_pass: bool) -> float:
    """Model FLOPs of one training step over unpacked sequences of the given lengths (prompt + response)."""
    total = 0.0
    for n in seqs:
        total += n * forward_flops_per_token(model, n / 2)
    return total * (3 + (1 if old_pass else 0))


def peak_result(size: int, repeats: int) -> Result:
    peak = measure_peak((size // 2, size, size * 2), repeats)
    res = Result("matmul_peak", {"sizes": [size // 2, size, size * 2], "repeats": repeats})
    res.figures = peak
    res.tables.append(table(["n", "GFLOP/s"], [[n, v / 1e9] for n, v in peak["by_size"].items()]))
    res.notes.append(f"peak (best size) {peak['peak_flops_per_s'] / 1e9:.1f} GFLOP/s fp32 at {peak['threads']} torch threads")
    return res

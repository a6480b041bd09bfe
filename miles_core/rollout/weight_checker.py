"""SGLang's weights checker (its /weights_checker, model_executor's WeightChecker) for the HF engine: the check behind
the reference's check_weight_update_equal.

    snapshot       keep a CPU copy of every parameter as loaded
    reset_tensors  overwrite every parameter with random values (a tensor the next sync misses cannot pass)
    compare        every parameter equals its snapshot (names with a ``skip`` substring: reported, not failed)

The engine's tensors are plain floating tensors (no quantized dtypes), so ``allow_quant_error`` changes nothing here.
"""

from __future__ import annotations

import logging
from typing import Sequence

import torch

ACTIONS = ("snapshot", "reset_tensors", "compare")
log = logging.getLogger(__name__)


class WeightCheckError(RuntimeError):
    """compare found parameters that differ from the snapshot (or there was no snapshot)."""


class WeightChecker:
    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.snapshot: dict[str, torch.Tensor] | None = None

    @torch.no_grad()
    def handle(self, action: str, skip: Sequence[str] = ()) -> str:
        """-> a one-line report; raises WeightCheckError when compare fails."""
        params = dict(self.model.named_parameters())
        if action == "snapshot":
            self.snapshot = {n: p.detach().to("cpu", copy=True) for n, p in params.items()}
            return f"snapshot of {len(params)} parameters"
        if action == "reset_tensors":
            g = torch.Generator().manual_seed(0)
            for p in params.values():
                p.copy_(torch.rand(p.shape, generator=g, dtype=torch.float32).to(p.dtype))
            return f"reset {len(params)} parameters"
        if action == "compare":
            return self._compare(params, skip)
        raise ValueError(f"weights checker: unknown action {action!r}; the actions are {', '.join(ACTIONS)}")

    def _compare(self, params: dict[str, torch.Tensor], skip: Sequence[str]) -> str:
        if self.snapshot is None:
            raise WeightCheckError("weights checker: compare before a snapshot")
        differ = [n for n, p in params.items() if not torch.equal(p.detach().cpu(), self.snapshot[n])]
        skipped = [n for n in differ if any(s in n for s in skip)]
        failed = [n for n in differ if n not in skipped]
        if skipped:
            log.info("weights checker: %d parameters differ but are on the skip list: %s", len(skipped), skipped[:5])
        if failed:
            raise WeightCheckError(f"weights checker: {len(failed)} of {len(params)} parameters differ from the snapshot after "
                                   f"the weight update: {failed[:5]}")
        return f"{len(params) - len(differ)} of {len(params)} parameters equal the snapshot ({len(skipped)} skipped)"

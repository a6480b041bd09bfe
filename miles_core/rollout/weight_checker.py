"""SGLang's weights checker (its /weights_checker, model_executor's WeightChecker) for the HF engine: the check behind
the reference's check_weight_update_equal.

    snapshot       keep a CPU copy of every parameter as loaded
    reset_tensors  overwrite every parameter with random values (a tensor the next sync misses cannot pass)
    compare        every parameter equals its snapshot (names with a ``skip`` substring: reported, not failed)
    checksum       a digest of every tensor the engine holds (SGLang's ChecksumInfo: checksums, per_gpu_checksum,
                   parallelism_info); ours hashes each tensor of the state dict (tied aliases included, as a sync sends
                   them) with weights/disk.py tensor_sha256, the trainer's digest (save_local_weight_checksum)

The engine's tensors are plain floating tensors (no quantized dtypes), so ``allow_quant_error`` changes nothing here.
"""

from __future__ import annotations

import logging
from typing import Sequence

import torch

ACTIONS = ("snapshot", "reset_tensors", "compare", "checksum")
log = logging.getLogger(__name__)


class WeightCheckError(RuntimeError):
    """compare found parameters that differ from the snapshot (or there was no snapshot)."""


class WeightChecker:
    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.snapshot: dict[str, torch.Tensor] | None = None

    @torch.no_grad()
    def handle(self, action: str, skip: Sequence[str] = ()) -> str | dict:
        """-> a one-line report (checksum: the ChecksumInfo dict); raises WeightCheckError when compare fails."""
        if action == "checksum":
            return checksum_info(self.model, skip)
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


def checksum_info(model: torch.nn.Module, skip: Sequence[str] = ()) -> dict:
    """SGLang's ChecksumInfo of the one model copy (rank 0 of 1): {checksums: {name: sha256 hex}, per_gpu_checksum,
    parallelism_info}; names with a ``skip`` substring are left out, as SGLang's skip_tensor_list."""
    import hashlib

    from miles_core.weights.disk import tensor_sha256

    sums = {n: tensor_sha256(t) for n, t in model.state_dict().items() if not any(s in n for s in skip)}
    overall = hashlib.sha256("".join(n + sums[n] for n in sorted(sums)).encode()).hexdigest()
    one = {"tp_rank": 0, "tp_size": 1, "dp_rank": 0, "dp_size": 1, "pp_rank": 0, "pp_size": 1, "rank": 0, "size": 1}
    return {"checksums": sums, "per_gpu_checksum": overall, "parallelism_info": one}


def merge_ranks(ranks: list[dict]) -> dict[str, str]:
    """One engine's {name: digest} from its ranks' ChecksumInfo: one rank as it is, several with a ``rank<r>/`` prefix
    (the reference's checksum_utils._merge_inference_engine_ranks: TP shards of one name never clobber)."""
    if len(ranks) == 1:
        return dict(ranks[0]["checksums"])
    ordered = sorted(ranks, key=lambda r: r["parallelism_info"]["rank"])
    return {f"rank{r['parallelism_info']['rank']}/{n}": v for r in ordered for n, v in r["checksums"].items()}

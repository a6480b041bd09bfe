"""Mixed precision of the torch trainer: the ``dtype`` field (misc config) -> where each number lives.

    dtype              trained parameters (main    forward (activations,     gradients, optimizer   sent to engines,
                       weights, in checkpoints)    matmuls)                  state, loss math        written by export
    float32, float64   that dtype                  that dtype                that dtype              that dtype
    bfloat16, float16  float32                     autocast to the dtype     float32                 the dtype

A 16-bit run keeps its trained models (policy, critic) in float32 and runs their forward passes under
``torch.autocast(device, dtype)``: matmuls and attention in the 16-bit dtype, norms and softmaxes where
autocast keeps them (float32), the log-softmax of the logits and every loss in float32 (batch.py casts the
logits). Gradients are float32 because the parameters are, so micro-batch accumulation and the data-parallel
reduction (FSDP2 on float32 shards) are float32, and AdamW steps float32 weights: an update of lr 1e-6 is not
lost under bfloat16's 8-bit mantissa (docs/decisions.md, "bf16 in the torch trainer"). Forward-only models
(reference, teacher) are loaded in the 16-bit dtype. Weight sync and exports cast to the dtype, so engines and
HF snapshots hold what the recipe names.

float16 has no loss scaling here (the gradients are float32, the activations' backward is float16): use
bfloat16, or the Megatron trainer, whose optimizer scales the loss.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
                                  "float16": torch.float16}
HALF = (torch.bfloat16, torch.float16)  # dtypes trained with float32 main weights


@dataclass(frozen=True)
class Precision:
    """model_dtype: the run's ``dtype`` (what engines and exports get); device_type: "cpu" | "cuda" (autocast's)."""

    model_dtype: torch.dtype
    device_type: str

    @classmethod
    def of(cls, dtype: str, device: torch.device | str) -> "Precision":
        if dtype not in DTYPES:
            raise ValueError(f"dtype: {dtype!r}; expected one of {list(DTYPES)}")
        return cls(model_dtype=DTYPES[dtype], device_type=torch.device(device).type)

    @property
    def mixed(self) -> bool:
        return self.model_dtype in HALF

    @property
    def main_dtype(self) -> torch.dtype:
        """The dtype of trained parameters, their gradients and optimizer state."""
        return torch.float32 if self.mixed else self.model_dtype

    def autocast(self) -> contextlib.AbstractContextManager:
        """The forward passes' context: autocast to the model dtype when mixed, else nothing."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.model_dtype)

    def check_trained(self, module: torch.nn.Module, what: str) -> None:
        """Refuse a trained module whose floating parameters are not in main_dtype (an AdamW step on 16-bit
        weights loses updates below their resolution)."""
        bad = sorted({str(p.dtype).removeprefix("torch.") for p in module.parameters()
                      if p.dtype.is_floating_point and p.dtype != self.main_dtype})
        if bad:
            main = str(self.main_dtype).removeprefix("torch.")
            raise ValueError(f"dtype {str(self.model_dtype).removeprefix('torch.')}: the {what}'s parameters are {bad}, "
                             f"but a trained model keeps {main} main weights; load it with dtype={main} "
                             "(training/backends.py does)")

    def to_model_dtype(self, named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) with floating tensors cast to the model dtype (weight sync); others as they are."""
        for name, t in named:
            yield name, t.to(self.model_dtype) if t.is_floating_point() and t.dtype != self.model_dtype else t

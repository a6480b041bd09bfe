"""The one device choice: the ``device`` field (cluster config) -> a ``torch.device``.

    cpu    torch.device("cpu")
    cuda   the current CUDA device (cuda:0 of the devices this process sees); DeviceUnavailable
           naming the field when torch sees none
    auto   cuda when torch sees a CUDA device, else cpu

Every part that puts a model somewhere calls ``resolve_device``: the torch trainer, its reference,
critic and teacher models (training/backends.py), the in-process HF engine (runtime/local.py), the HTTP
engine server (``--device``, rollout/http/server.py) and the Megatron trainer. On Ray each actor resolves
the field itself, in its own process: an actor placed with ``num_gpus`` sees only its GPU (Ray sets
``CUDA_VISIBLE_DEVICES`` for it, and miles never overrides it), so "the current CUDA device" is its own.
Preflight (miles_core/preflight.py) resolves it once in the driver before any model loads, so
``device: cuda`` on a machine without CUDA fails in a second, naming the field.
"""

from __future__ import annotations

import torch

DEVICES = ("cpu", "cuda", "auto")


class DeviceUnavailable(ValueError):
    """``device: cuda`` where torch sees no CUDA device."""


def resolve_device(device: str) -> torch.device:
    """``device`` (cpu | cuda | auto) -> where models and batches live in this process (see the module docstring)."""
    if device not in DEVICES:
        raise ValueError(f"device: {device!r}; expected one of {list(DEVICES)}")
    if device == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if device == "cuda":
        raise DeviceUnavailable("device: cuda, but torch sees no CUDA device (torch.cuda.is_available() is false); "
                                "use device: cpu (or auto)")
    return torch.device("cpu")

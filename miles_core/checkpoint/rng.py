"""Capture and restore the process-global random number generators.

State dict layout (all plain Python / torch types, so `torch.load(weights_only=True)` reads it):

    {"python": random.getstate(),
     "numpy": {"algorithm": str, "keys": list[int] (624), "pos": int, "has_gauss": int,
               "cached_gaussian": float},          # numpy's legacy global RandomState
     "torch_cpu": ByteTensor,
     "torch_cuda": list[ByteTensor]}               # one per visible device; only when CUDA is available

Not covered: `numpy.random.Generator` objects (default_rng) and `torch.Generator` objects that
code creates itself — those belong to their owners' state. Restoring CUDA state onto a machine
with a different device count, or without CUDA, logs a warning and leaves CUDA RNGs as they are.
"""

from __future__ import annotations

import logging
import random

import numpy as np
import torch

from miles_core.checkpoint.errors import CheckpointError

logger = logging.getLogger(__name__)

_REQUIRED = ("python", "numpy", "torch_cpu")


def capture_rng_state() -> dict:
    """Snapshot python `random`, numpy's global RNG, torch CPU and (if available) CUDA RNGs."""
    algorithm, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = {
        "python": random.getstate(),
        "numpy": {
            "algorithm": algorithm,
            "keys": keys.tolist(),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch_cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    """Restore a `capture_rng_state()` snapshot: subsequent draws repeat the captured ones."""
    missing = [k for k in _REQUIRED if k not in state]
    if missing:
        raise CheckpointError(f"RNG state is missing {missing} (has {sorted(state)})")
    random.setstate(_as_python_state(state["python"]))
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["algorithm"],
            np.asarray(np_state["keys"], dtype=np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch_cpu"])
    _restore_cuda(state.get("torch_cuda"))


def _as_python_state(value) -> tuple:
    """random.setstate needs tuples; a serialiser may have turned them into lists."""
    version, internal, gauss = value
    return (version, tuple(internal), gauss)


def _restore_cuda(cuda_states: list | None) -> None:
    if cuda_states is None:
        return
    if not torch.cuda.is_available():
        logger.warning("checkpoint holds CUDA RNG state but CUDA is not available; CUDA RNG not restored")
        return
    if len(cuda_states) != torch.cuda.device_count():
        logger.warning(
            "checkpoint holds CUDA RNG state for %d devices, this process sees %d; CUDA RNG not restored",
            len(cuda_states),
            torch.cuda.device_count(),
        )
        return
    torch.cuda.set_rng_state_all(cuda_states)

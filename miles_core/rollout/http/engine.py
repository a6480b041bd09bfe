"""Reading HF weight files (the server's disk reload), and the engine names the server modules use.

The engine itself is ``miles_core.rollout.hf_engine.HFEngine`` (per-request seeds, the "exact" /
"dynamic" batching policy, abort polling and the progress heartbeat all live there); the server
builds one with ``HFEngine.from_pretrained``. ``request_seed``, ``BATCHING`` and ``HFEngine`` are
re-exported here for the server modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch

from miles_core.rollout.hf_engine import BATCHING, Batching, HFEngine, request_seed

__all__ = ["BATCHING", "Batching", "HFEngine", "hf_weight_files", "iter_hf_weights", "request_seed"]


def hf_weight_files(path: str | Path) -> list[Path]:
    """The safetensors files of an HF dir: model.safetensors, or the shards its index names."""
    import json

    path = Path(path)
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        outside = [s for s in shards if not (path / s).resolve().is_relative_to(path.resolve())]
        if outside:
            raise ShardOutsideModelDir(f"{index}: weight_map names shards outside the model dir {path}: {outside}")
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise FileNotFoundError(f"{path}: index names missing shards {missing}")
        return [path / s for s in shards]
    raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json")


class ShardOutsideModelDir(ValueError):
    """An index whose weight_map points outside its own directory (``../../etc/passwd``): never opened."""


def iter_hf_weights(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every tensor in the HF dir's safetensors files, file by file."""
    from safetensors import safe_open

    for file in hf_weight_files(path):
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)

"""HF weight files of a model dir: which safetensors files it has, and every tensor in them (the engines' disk
reload: our server's /update_weights_from_disk, HFEngine.update_weights_from_disk)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch


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

"""State dicts <-> safetensors files, with aliased (tied) tensors stored once.

safetensors refuses tensors that share memory. A state dict of a model with tied embeddings holds
the same tensor under two names (`model.embed_tokens.weight`, `lm_head.weight`). `save_state_dict`
keeps the first name in state-dict order, drops the others and records them in the file's header
metadata as `miles.aliases = {"dropped name": "kept name"}`; `load_state_dict_file` puts them back,
so `module.load_state_dict(strict=True)` sees every key. Tensors that share storage without being
the same view (e.g. slices of one fused buffer) are cloned, so they reload as independent tensors.
Tensors are written as they are (dtype kept, moved to CPU, made contiguous): a reload is bit-exact.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from miles_core.checkpoint._fs import fsync_path
from miles_core.checkpoint.errors import CheckpointError

ALIASES_KEY = "miles.aliases"


def _view_key(t: torch.Tensor) -> tuple:
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), t.dtype, tuple(t.shape), tuple(t.stride()))


def alias_map(state_dict: dict[str, torch.Tensor]) -> dict[str, str]:
    """`{alias name: first name}` for entries that are the same view of the same memory."""
    aliases: dict[str, str] = {}
    first_name: dict[tuple, str] = {}
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            raise CheckpointError(f"state dict entry {name!r} is a {type(tensor).__name__}, not a tensor")
        key = _view_key(tensor)
        if key in first_name:
            aliases[name] = first_name[key]
        else:
            first_name[key] = name
    return aliases


def split_aliases(state_dict: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Split a state dict into unique tensors and `{alias name: kept name}`."""
    aliases = alias_map(state_dict)
    kept = {name: tensor for name, tensor in state_dict.items() if name not in aliases}
    storages = Counter(t.untyped_storage().data_ptr() for t in kept.values() if t.numel())
    for name, tensor in kept.items():
        shared = tensor.numel() and storages[tensor.untyped_storage().data_ptr()] > 1
        kept[name] = tensor.detach().clone() if shared else tensor.detach()
    return kept, aliases


def save_state_dict(state_dict: dict[str, torch.Tensor], path: Path) -> None:
    """Write `state_dict` to one safetensors file (aliases recorded) and fsync it."""
    tensors, aliases = split_aliases(state_dict)
    tensors = {k: v.cpu().contiguous() for k, v in tensors.items()}
    metadata = {"format": "pt", ALIASES_KEY: json.dumps(aliases)}
    save_file(tensors, path, metadata=metadata)
    fsync_path(path)


def load_state_dict_file(path: Path) -> dict[str, torch.Tensor]:
    """Read a file written by `save_state_dict` (CPU tensors), aliases restored."""
    with safe_open(path, framework="pt", device="cpu") as f:
        metadata = f.metadata() or {}
        tensors = f.get_tensors()
    try:
        aliases = json.loads(metadata.get(ALIASES_KEY, "{}"))
    except ValueError as e:
        raise CheckpointError(f"{path}: bad {ALIASES_KEY} header metadata ({e})") from e
    for alias, source in aliases.items():
        if source not in tensors:
            raise CheckpointError(f"{path}: alias {alias!r} points to missing tensor {source!r}")
        tensors[alias] = tensors[source]
    return tensors


def load_into(module: torch.nn.Module, path: Path) -> None:
    """Load a safetensors state dict into `module` strictly; a mismatch names the file.

    Tied parameters of `module` must receive equal values: loading an untied checkpoint into a
    tied model would otherwise silently keep whichever copy is loaded last.
    """
    state_dict = load_state_dict_file(path)
    for alias, source in alias_map(module.state_dict()).items():
        a, b = state_dict.get(alias), state_dict.get(source)
        if a is not None and b is not None and a is not b and not torch.equal(a, b):
            raise CheckpointError(
                f"{path}: {type(module).__name__} ties {alias!r} to {source!r}, the file holds different values"
            )
    try:
        module.load_state_dict(state_dict, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: does not match {type(module).__name__}: {e}") from e

"""`validate_hf_dir`: cheap structural check of an HF model directory before conversion/loading.

Checks, in order, and raises `CheckpointError` naming the file and the field at the first failure:

1. `config.json` exists, is a JSON object, and has `model_type` (str) and positive ints
   `hidden_size`, `num_hidden_layers`, `vocab_size` (looked up in `text_config` too, for
   multimodal configs).
2. Weights: `model.safetensors`, or `model.safetensors.index.json` whose `weight_map` shards all
   exist and hold the tensors it names, or `pytorch_model.bin` (or its index). Only safetensors
   headers are read (8-byte length + JSON), never tensor data.
3. Tokenizer: one of tokenizer.json, tokenizer.model, vocab.json, vocab.txt, tokenizer.tiktoken.

Summary dict: model_type, num_params (sum over safetensors headers: stored tensors only, so a tied
lm_head is not counted twice; None for .bin), dtype (config `dtype`/`torch_dtype`, else the
headers'), tie_word_embeddings (config value, HF's default True when absent), weight_format,
weight_files, total_size (bytes of tensor data), tokenizer_files.
"""

from __future__ import annotations

import json
import math
import struct
from collections import Counter
from pathlib import Path

from miles_core.checkpoint.errors import CheckpointError

CONFIG_FILE = "config.json"
REQUIRED_INT_FIELDS = ("hidden_size", "num_hidden_layers", "vocab_size")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tokenizer.tiktoken")
_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn"}
_MAX_HEADER = 100 * 2**20


def validate_hf_dir(path: Path) -> dict:
    """Validate an HF model directory; return its summary (see module docstring)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory")
    config = _check_config(path / CONFIG_FILE)
    weights = _check_weights(path)
    tokenizer_files = [name for name in TOKENIZER_FILES if (path / name).is_file()]
    if not tokenizer_files:
        raise CheckpointError(f"{path}: no tokenizer file (expected one of {list(TOKENIZER_FILES)})")
    header_dtypes = weights.pop("dtypes")
    dtype = config.get("dtype") or config.get("torch_dtype") or (header_dtypes.most_common(1) or [(None, 0)])[0][0]
    return {
        "model_type": config["model_type"],
        "num_params": weights.pop("num_params"),
        "dtype": dtype,
        "tie_word_embeddings": config.get("tie_word_embeddings", True),
        **weights,
        "tokenizer_files": tokenizer_files,
    }


def _check_config(file: Path) -> dict:
    if not file.is_file():
        raise CheckpointError(f"{file}: missing")
    try:
        config = json.loads(file.read_text())
    except ValueError as e:
        raise CheckpointError(f"{file}: not valid JSON ({e})") from e
    if not isinstance(config, dict):
        raise CheckpointError(f"{file}: expected a JSON object, got {type(config).__name__}")
    if not isinstance(config.get("model_type"), str) or not config["model_type"]:
        raise CheckpointError(f"{file}: missing or empty field 'model_type'")
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for field in REQUIRED_INT_FIELDS:
        value = config.get(field, text_config.get(field))
        if value is None:
            raise CheckpointError(f"{file}: missing field {field!r}")
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise CheckpointError(f"{file}: field {field!r} must be a positive int, got {value!r}")
    return config


def _check_weights(path: Path) -> dict:
    """Locate the weights; summarise safetensors headers. Raises naming the missing file."""
    if (path / "model.safetensors").is_file():
        return _summarise_shards(path, {"model.safetensors": None}, "safetensors")
    index_file = path / "model.safetensors.index.json"
    if index_file.is_file():
        weight_map = _read_weight_map(index_file)
        shards: dict[str, list[str]] = {}
        for name, shard in weight_map.items():
            shards.setdefault(shard, []).append(name)
        return _summarise_shards(path, shards, "safetensors-index")
    for name in ("pytorch_model.bin", "pytorch_model.bin.index.json"):
        if (path / name).is_file():
            files = [name] if name.endswith(".bin") else sorted(set(_read_weight_map(path / name).values()))
            missing = [f for f in files if not (path / f).is_file()]
            if missing:
                raise CheckpointError(f"{path / name}: shard file(s) {missing} missing")
            total = sum((path / f).stat().st_size for f in files)
            return {"weight_format": "pytorch_bin", "weight_files": files, "total_size": total,
                    "num_params": None, "dtypes": Counter()}  # fmt: skip
    raise CheckpointError(
        f"{path}: no weights (expected model.safetensors, model.safetensors.index.json or pytorch_model.bin)"
    )


def _read_weight_map(index_file: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index_file.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{index_file}: unreadable or no 'weight_map' ({e!r})") from e
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index_file}: 'weight_map' must be a non-empty object")
    return weight_map


def _summarise_shards(path: Path, shards: dict[str, list[str] | None], fmt: str) -> dict:
    """Read each shard's header; check the tensors the index names are there."""
    num_params, total, dtypes = 0, 0, Counter()
    for shard, expected in sorted(shards.items()):
        file = path / shard
        if not file.is_file():
            raise CheckpointError(f"{file}: shard named in the index is missing")
        header = read_safetensors_header(file)
        absent = sorted(set(expected or ()) - set(header))
        if absent:
            raise CheckpointError(f"{file}: tensors named in the index are absent: {absent[:5]}")
        for info in header.values():
            num_params += math.prod(info["shape"])
            total += info["data_offsets"][1] - info["data_offsets"][0]
            dtypes[_ST_DTYPES.get(info["dtype"], info["dtype"])] += 1
    return {"weight_format": fmt, "weight_files": sorted(shards), "total_size": total,
            "num_params": num_params, "dtypes": dtypes}  # fmt: skip


def read_safetensors_header(file: Path) -> dict[str, dict]:
    """Tensor entries of a safetensors header (`__metadata__` dropped); never reads tensor data."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        raw = f.read(8)
        (length,) = struct.unpack("<Q", raw) if len(raw) == 8 else (None,)
        if length is None or length > min(size - 8, _MAX_HEADER):
            raise CheckpointError(f"{file}: not a safetensors file (bad header length)")
        try:
            header = json.loads(f.read(length))
        except ValueError as e:
            raise CheckpointError(f"{file}: unreadable safetensors header ({e})") from e
    header.pop("__metadata__", None)
    return header

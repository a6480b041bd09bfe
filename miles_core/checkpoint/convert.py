"""Conversion for the torch backend, with the interface the Megatron conversion will share:
``convert_for_<backend>(hf_checkpoint, cache_dir) -> {model_path, summary}`` and
``checkpoint_to_hf(checkpoint_dir, tokenizer_dir, export_dir, rollout_id) -> export path``.

For torch the "converted" checkpoint is the HF dir itself: conversion resolves it (builtin://,
local dir, hub id), validates config, weights (checkpoint/hf_load.py: the safetensors headers against
config.json) and tokenizer, and reports dtype and tied embeddings.
"""

from __future__ import annotations

from pathlib import Path

from .errors import CheckpointError
from .export import export_hf
from .hf_load import check_hf_weights
from .layout import MODEL_CONFIG, read_info
from .load import load_checkpoint
from .validate import validate_hf_dir


def convert_for_torch(hf_checkpoint: str, cache_dir: Path) -> dict:
    from miles_core.models import resolve_model_path

    path = resolve_model_path(hf_checkpoint, cache_dir)
    summary = validate_hf_dir(path)
    check_hf_weights(path)  # every tensor config.json implies, with its shape, and no other (headers only)
    return {"model_path": str(path), "summary": summary}


def checkpoint_to_hf(checkpoint_dir: Path, tokenizer_dir: Path, export_dir: Path, rollout_id: int) -> Path:
    """Load a saved training checkpoint into its architecture and export it as an HF snapshot."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    info = read_info(checkpoint_dir)
    if "lora_base_sha256" in info.meta:
        raise CheckpointError(f"{checkpoint_dir}: a LoRA checkpoint holds the adapters only, not the base model, so it cannot be "
                              "exported on its own yet; the run's exports (export_interval) hold the merged model and the "
                              "PEFT adapter (docs/guide/lora.md)")
    config = AutoConfig.from_pretrained(checkpoint_dir / Path(MODEL_CONFIG).parent)
    model = AutoModelForCausalLM.from_config(config)
    load_checkpoint(info, model=model, restore_rng=False)
    return export_hf(model, AutoTokenizer.from_pretrained(tokenizer_dir), export_dir, rollout_id)

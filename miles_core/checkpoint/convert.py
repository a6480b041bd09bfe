"""Conversion for the torch backend, with the interface the Megatron conversion will share:
``convert_for_<backend>(hf_checkpoint, cache_dir) -> {model_path, summary}`` and
``checkpoint_to_hf(checkpoint_dir, tokenizer_dir, export_dir, rollout_id) -> export path``.

For torch the "converted" checkpoint is the HF dir itself: conversion resolves it (builtin://,
local dir, hub id), validates config, weights and tokenizer, and reports dtype and tied embeddings.
"""

from __future__ import annotations

from pathlib import Path

from .export import export_hf
from .layout import MODEL_CONFIG, read_info
from .load import load_checkpoint
from .validate import validate_hf_dir


def convert_for_torch(hf_checkpoint: str, cache_dir: Path) -> dict:
    from miles_core.models import resolve_model_path

    path = resolve_model_path(hf_checkpoint, cache_dir)
    return {"model_path": str(path), "summary": validate_hf_dir(path)}


def checkpoint_to_hf(checkpoint_dir: Path, tokenizer_dir: Path, export_dir: Path, rollout_id: int) -> Path:
    """Load a saved training checkpoint into its architecture and export it as an HF snapshot."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(checkpoint_dir / Path(MODEL_CONFIG).parent)
    model = AutoModelForCausalLM.from_config(config)
    load_checkpoint(read_info(checkpoint_dir), model=model, restore_rng=False)
    return export_hf(model, AutoTokenizer.from_pretrained(tokenizer_dir), export_dir, rollout_id)

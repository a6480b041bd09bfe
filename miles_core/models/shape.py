"""The few sizes of a model that parallelism must divide, read without loading it: from a local HF
dir's config.json, or a builtin:// spec (before it is built). A hub id is not read at config load
(that would download); the Megatron trainer checks it again once the model dir exists."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelShape:
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    num_experts: int  # routed experts (0 = dense)


def shape_from_config(config: dict) -> ModelShape:
    """A config.json mapping -> ModelShape (MoE experts under their family's key)."""
    heads = int(config["num_attention_heads"])
    experts = config.get("n_routed_experts") or config.get("num_experts") or config.get("num_local_experts") or 0
    return ModelShape(
        num_attention_heads=heads, num_key_value_heads=int(config.get("num_key_value_heads") or heads),
        num_hidden_layers=int(config["num_hidden_layers"]), num_experts=int(experts),
    )


def model_shape(hf_checkpoint: str) -> ModelShape | None:
    """The shape of hf_checkpoint, or None when it cannot be known without a download."""
    from . import PREFIX
    from .builtin import BUILTIN_MODELS
    from .glm import GLM_MODELS

    if hf_checkpoint.startswith(PREFIX):
        spec = {**BUILTIN_MODELS, **GLM_MODELS}.get(hf_checkpoint[len(PREFIX):])
        if spec is None:
            return None  # a GGUF builtin or a typo: resolved (and reported) when the model loads
        return ModelShape(num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.num_key_value_heads,
                          num_hidden_layers=spec.num_hidden_layers, num_experts=getattr(spec, "n_routed_experts", 0))
    config = Path(hf_checkpoint) / "config.json"
    return shape_from_config(json.loads(config.read_text())) if config.is_file() else None

"""The corrupted HF checkpoints of issue 29's first finding, shared by the loader tests (tests/checkpoint/test_hf_load.py)
and the trainers' builders (tests/training/megatron_backend/test_convert.py): each case -> how to make it from a good
tiny Qwen3 dir, and what the refusal must say (the tensor and the config.json field)."""

from __future__ import annotations

import json
import shutil

import torch
from safetensors.torch import load_file, save_file

K_PROJ = "model.layers.1.self_attn.k_proj.weight"


def tiny_qwen3(path):
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=8, vocab_size=64, tie_word_embeddings=False)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def edit_tensors(src, dst, edit):
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})


def _edit_config(src, dst, edit):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    edit(config)
    (dst / "config.json").write_text(json.dumps(config))


def _truncate(src, dst):
    shutil.copytree(src, dst)
    data = (dst / "model.safetensors").read_bytes()
    (dst / "model.safetensors").write_bytes(data[: len(data) - 100])


def _layers(delta):
    def edit(c):
        c["num_hidden_layers"] += delta
        c.pop("layer_types", None)
    return edit


# corruption -> (make it, what the error must say)
CASES = {
    "missing": (lambda s, d: edit_tensors(s, d, lambda t: t.pop(K_PROJ)),
                [f"{K_PROJ}: missing", "num_key_value_heads, head_dim"]),
    "missing_norm": (lambda s, d: edit_tensors(s, d, lambda t: t.pop("model.layers.0.input_layernorm.weight")),
                     ["model.layers.0.input_layernorm.weight: missing", "hidden_size"]),
    "extra": (lambda s, d: edit_tensors(s, d, lambda t: t.update({"model.layers.0.mlp.extra.weight": torch.zeros(2)})),
              ["model.layers.0.mlp.extra.weight (model.safetensors): unexpected"]),
    "shape": (lambda s, d: edit_tensors(s, d, lambda t: t.update({"model.layers.0.mlp.down_proj.weight": torch.zeros(32, 63)})),
              ["model.layers.0.mlp.down_proj.weight (model.safetensors): shape [32, 63]", "intermediate_size) implies [32, 64]"]),
    "layers_plus": (lambda s, d: _edit_config(s, d, _layers(+1)), ["layers [2]: missing", "num_hidden_layers=3"]),
    "layers_minus": (lambda s, d: _edit_config(s, d, _layers(-1)), ["layers [1]: in the files", "num_hidden_layers=1"]),
    "dtype": (lambda s, d: edit_tensors(s, d, lambda t: t.update({K_PROJ: t[K_PROJ].to(torch.int32)})),
              [f"{K_PROJ} (model.safetensors): dtype I32 is not a float type"]),
    "truncated": (_truncate, ["model.safetensors: truncated"]),
    # a file of the embeddings and norm only (a shard of every layer lost): was "max() arg is an empty sequence"
    "no_layers": (lambda s, d: edit_tensors(s, d, lambda t: [t.pop(k) for k in [k for k in t if k.startswith("model.layers.")]]),
                  ["layers [0, 1]: missing from the files (config.json num_hidden_layers=2)", "the files hold layers none"]),
}


def assert_named(error: str, expected: list[str]):
    flat = " ".join(error.split())
    for part in expected:
        assert part in flat, f"{part!r} not in: {error}"

"""Decode steps of a Llama-family causal LM without the transformers call stack.

A decode step of a small model on CPU is mostly framework overhead: on builtin://tiny-qwen2 one HF
forward of 1 token costs ~4.5 ms at batch 1 and ~9 ms at batch 32 (docs/performance.md), i.e. half of
the time is mask building, cache objects, output classes and dispatch. ``LeanDecoder`` runs the same
modules' weights with the same ops (RMSNorm, q/k/v/o projections, the model's rotary embedding
and ``apply_rotary_pos_emb``, scaled-dot-product attention, the MLP's projections and activation, the
final norm and LM head) over a preallocated static KV cache, so a step is ~20 tensor ops per layer. In
fp32 the RMSNorms run as one ``F.rms_norm`` each (bit for bit the modules' pow/mean/rsqrt/mul on CPU,
2x faster at decode sizes); other dtypes call the modules. It starts from the KV cache
of an ordinary HF prefill. Same numbers as the HF step up to float rounding
(tests/rollout/test_hf_engine.py).

Supported: ``model_type`` in LEAN_MODEL_TYPES without sliding-window attention; others use the HF forward.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from miles_core.models.lm_head import lm_head

LEAN_MODEL_TYPES = frozenset({"qwen2", "llama"})


def lean_supported(model) -> bool:
    config = model.config
    return (getattr(config, "model_type", None) in LEAN_MODEL_TYPES and not getattr(config, "use_sliding_window", False)
            and getattr(config, "_attn_implementation", "sdpa") in ("sdpa", "eager"))


class LeanDecoder:
    """Static KV cache [b, kv_heads, P + steps, head_dim] per layer, filled from an HF prefill cache."""

    def __init__(self, model, past, attn: torch.Tensor, steps: int):
        """past: the prefill's cache (b rows); attn: its [b, P] attention mask; steps: decode steps to allow."""
        self.model, self.base = model, model.base_model
        self.rope = sys.modules[type(self.base.layers[0].self_attn).__module__].apply_rotary_pos_emb
        b, P = attn.shape
        self.cur = P  # next column to write
        self.k, self.v = [], []
        for layer in past.layers:
            kv_heads, head_dim = layer.keys.shape[1], layer.keys.shape[3]
            k = layer.keys.new_empty((b, kv_heads, P + steps, head_dim))
            v = layer.values.new_empty((b, kv_heads, P + steps, head_dim))
            k[:, :, :P], v[:, :, :P] = layer.keys, layer.values
            self.k.append(k), self.v.append(v)
        self.valid = torch.zeros((b, P + steps), dtype=torch.bool, device=attn.device)  # [b, P + steps] key columns to attend
        self.valid[:, :P] = attn.bool()

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows (finished rows leave the batch); copies only the filled columns."""
        c = self.cur
        self.k = [_take(k, rows, c) for k in self.k]
        self.v = [_take(v, rows, c) for v in self.v]
        self.valid = self.valid[rows]

    def step(self, tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """tokens [b], position [b, 1] -> last-position logits [b, V]."""
        c = self.cur
        self.valid[:, c] = True
        mask = self.valid[:, None, None, : c + 1]  # [b, 1, 1, c + 1]
        x = self.base.embed_tokens(tokens[:, None])  # [b, 1, H]
        cos, sin = self.base.rotary_emb(x, position)
        b = x.shape[0]
        for layer, K, V in zip(self.base.layers, self.k, self.v):
            a = layer.self_attn
            h = _rms_norm(layer.input_layernorm, x)
            q = F.linear(h, a.q_proj.weight, a.q_proj.bias).view(b, 1, -1, a.head_dim).transpose(1, 2)  # [b, heads, 1, d]
            k = F.linear(h, a.k_proj.weight, a.k_proj.bias).view(b, 1, -1, a.head_dim).transpose(1, 2)  # [b, kv_heads, 1, d]
            v = F.linear(h, a.v_proj.weight, a.v_proj.bias).view(b, 1, -1, a.head_dim).transpose(1, 2)
            q, k = self.rope(q, k, cos, sin)
            K[:, :, c : c + 1], V[:, :, c : c + 1] = k, v
            o = F.scaled_dot_product_attention(q, K[:, :, : c + 1], V[:, :, : c + 1], attn_mask=mask, scale=a.scaling,
                                               enable_gqa=K.shape[1] != q.shape[1])  # [b, heads, 1, d]
            x = x + F.linear(o.transpose(1, 2).reshape(b, 1, -1), a.o_proj.weight, a.o_proj.bias)
            h, mlp = _rms_norm(layer.post_attention_layernorm, x), layer.mlp
            gate, up = F.linear(h, mlp.gate_proj.weight, mlp.gate_proj.bias), F.linear(h, mlp.up_proj.weight, mlp.up_proj.bias)
            x = x + F.linear(mlp.act_fn(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
        self.cur += 1
        return lm_head(self.model.get_output_embeddings(), _rms_norm(self.base.norm, x)[:, -1, :])  # [b, V]


def _rms_norm(norm, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` for a Qwen2 / Llama RMSNorm module: one fused op when x and its weight are fp32."""
    if x.dtype == torch.float32 and norm.weight.dtype == torch.float32:
        return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)
    return norm(x)


def _take(cache: torch.Tensor, rows: torch.Tensor, filled: int) -> torch.Tensor:
    """cache [b, h, capacity, d] -> [len(rows), h, capacity, d] holding those rows' first ``filled`` columns."""
    out = cache.new_empty((len(rows), *cache.shape[1:]))
    out[:, :, :filled] = cache[rows, :, :filled]
    return out

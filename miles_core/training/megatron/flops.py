"""Forward FLOPs of one sequence under the model args (balance_by_flops): the reference's estimate
(miles/utils/flops_utils.py calculate_fwd_flops), per layer q/kv projections (MLA's low-rank ones), causal attention
(QK^T halved, A*V), the output projection, a gated MLP (3 matrices; an MoE layer: moe_ffn_hidden_size * top-k plus
the shared expert), and the LM head. Only its ordering of sequences matters here: it weighs micro-batch partitions.
"""

from __future__ import annotations

from .model_args import ModelArgs


def _layer(a: ModelArgs, s: int, ffn: int) -> float:
    h, heads, groups, kv = a.hidden_size, a.num_attention_heads, a.num_query_groups, a.kv_channels
    if a.q_lora_rank is None:
        q = 2 * s * h * heads * kv
    else:
        q = 2 * s * a.q_lora_rank * (h + heads * (a.qk_head_dim + a.qk_pos_emb_head_dim))
    if a.kv_lora_rank is None:
        kv_proj = 4 * s * h * groups * kv
    else:
        kv_proj = 2 * s * (a.kv_lora_rank * (h + heads * (a.qk_head_dim + a.v_head_dim)) + h * a.qk_pos_emb_head_dim)
    qk_dim = (a.qk_head_dim + a.qk_pos_emb_head_dim) if a.qk_pos_emb_head_dim else kv
    attention = heads * s * s * qk_dim + heads * s * s * (a.v_head_dim or kv)  # causal QK^T (2 * ... / 2) and A*V
    return q + kv_proj + attention + 2 * s * h * h + 6 * s * h * ffn


def fwd_flops(seqlen: int, a: ModelArgs) -> float:
    """Estimated forward FLOPs of one sequence of ``seqlen`` tokens (module docstring)."""
    freq = a.moe_layer_freq if a.num_experts else None
    moe_layers = (sum(1 for f in freq if f) if freq is not None else a.num_layers) if a.num_experts else 0
    flops = _layer(a, seqlen, a.ffn_hidden_size) * (a.num_layers - moe_layers)
    if moe_layers:
        moe_ffn = (a.moe_ffn_hidden_size or 0) * a.moe_router_topk + (a.moe_shared_expert_intermediate_size or 0)
        flops += _layer(a, seqlen, moe_ffn) * moe_layers
    return flops + 2 * seqlen * a.hidden_size * a.vocab_size

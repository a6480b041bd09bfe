"""ModelArgs + ParallelConfig -> megatron-core ``TransformerConfig`` and this pipeline stage's ``GPTModel``
with RMSNorm, SwiGLU, RoPE: what the HF families of model_args.py are. Fusions that need CUDA kernels are off
(they are speed, not math).

The layer spec is chosen here, once (``layer_spec``): Transformer Engine's (``transformer_engine``: fused
norm + linear, TE attention taking packed rows as THD with cu_seqlens) when the device is CUDA and
transformer_engine imports, megatron's local spec (``local``: torch norms and linears) otherwise, its core
attention taking packed rows as THD too (attention.PackedDotProductAttention: attention inside each sequence, not
over a [W, W] mask of the whole pack) and a group's shared prompt once (``shares_prompts``; RoPE from the
micro-batch's position_ids, attention.PositionalRope; not with multi-latent attention, whose RoPE is its own).
The trainer names the choice in the run's params (``derived.trainer.layer_spec``).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from miles_core.config.parallel import ParallelConfig

from .model_args import ModelArgs


def _moe_kwargs(a: ModelArgs) -> dict:
    if not a.num_experts:
        return {}
    return dict(
        num_moe_experts=a.num_experts, moe_ffn_hidden_size=a.moe_ffn_hidden_size,
        moe_shared_expert_intermediate_size=a.moe_shared_expert_intermediate_size, moe_router_topk=a.moe_router_topk,
        moe_router_score_function=a.moe_router_score_function, moe_router_enable_expert_bias=a.moe_router_enable_expert_bias,
        moe_router_pre_softmax=a.moe_router_pre_softmax,
        moe_router_bias_update_rate=0.0, moe_router_topk_scaling_factor=a.moe_router_topk_scaling_factor,
        moe_layer_freq=list(a.moe_layer_freq) if a.moe_layer_freq else 1, moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0, moe_router_dtype="fp32", moe_grouped_gemm=False,
        moe_permute_fusion=False,
    )


def _mla_kwargs(a: ModelArgs) -> dict:
    if not a.multi_latent_attention:
        return {}
    return dict(multi_latent_attention=True, q_lora_rank=a.q_lora_rank, kv_lora_rank=a.kv_lora_rank, qk_head_dim=a.qk_head_dim,
                v_head_dim=a.v_head_dim, qk_pos_emb_head_dim=a.qk_pos_emb_head_dim, rotary_base=a.rotary_base,
                rope_type="rope")


def transformer_config(a: ModelArgs, p: ParallelConfig, dtype: torch.dtype, cpu: bool):
    """The TransformerConfig (MLATransformerConfig with multi-latent attention) of ``a`` under parallelism ``p``."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    cls = MLATransformerConfig if a.multi_latent_attention else TransformerConfig
    return cls(
        num_layers=a.num_layers, hidden_size=a.hidden_size, ffn_hidden_size=a.ffn_hidden_size,
        num_attention_heads=a.num_attention_heads, num_query_groups=a.num_query_groups, kv_channels=a.kv_channels,
        layernorm_epsilon=a.norm_epsilon, normalization="RMSNorm", gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, add_qkv_bias=a.add_qkv_bias, qk_layernorm=a.qk_layernorm,
        hidden_dropout=0.0, attention_dropout=0.0, params_dtype=dtype, pipeline_dtype=dtype, bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16, attention_softmax_in_fp32=True,
        tensor_model_parallel_size=p.tensor_model_parallel_size, pipeline_model_parallel_size=p.pipeline_model_parallel_size,
        context_parallel_size=p.context_parallel_size, expert_model_parallel_size=p.expert_model_parallel_size,
        expert_tensor_parallel_size=p.expert_tp, sequence_parallel=p.sequence_parallel,
        recompute_granularity=p.recompute_granularity, recompute_method=p.recompute_method,
        recompute_num_layers=p.recompute_num_layers, variable_seq_lengths=True, moe_token_dispatcher_type="alltoall",
        use_cpu_initialization=cpu, bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        persist_layer_norm=False, gradient_accumulation_fusion=False, apply_rope_fusion=False,
        **_moe_kwargs(a), **_mla_kwargs(a),
    )


def _without_transformer_engine() -> None:
    """megatron-core 0.16's moe_utils leaves te_general_gemm undefined when Transformer Engine is absent, then
    tests it against None in the router's gating linear: define it as None (the torch matmul path)."""
    from megatron.core.transformer.moe import moe_utils

    if not moe_utils.HAVE_TE and not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


@dataclass(frozen=True)
class LayerSpec:
    """name: "transformer_engine" | "local"; both take packed micro-batches as THD (cu_seqlens); shares_prompts: a
    packed group's prompt computed once (batching.packed), which TE's causal THD attention cannot take."""

    name: str
    use_transformer_engine: bool
    shares_prompts: bool

    def share_prompts(self, a: ModelArgs) -> bool:
        """Whether a stage of ``a`` under this spec packs a group's prompt once (not with multi-latent attention)."""
        return self.shares_prompts and not a.multi_latent_attention


LAYER_SPECS = {
    "transformer_engine": LayerSpec(name="transformer_engine", use_transformer_engine=True, shares_prompts=False),
    "local": LayerSpec(name="local", use_transformer_engine=False, shares_prompts=True),
}


def layer_spec(device: str, te_available: bool | None = None) -> LayerSpec:
    """The spec for a stage on ``device`` ("cpu" | "cuda"): Transformer Engine's on CUDA when it imports, else local."""
    te_available = importlib.util.find_spec("transformer_engine") is not None if te_available is None else te_available
    return LAYER_SPECS["transformer_engine" if device == "cuda" and te_available else "local"]


def build_stage(a: ModelArgs, config, use_transformer_engine: bool = False):
    """This rank's pipeline stage of the GPT model (embedding on the first stage, output layer on the last); the local
    layer spec, or Transformer Engine's (GPU only: bench/gpu_check.py)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    _without_transformer_engine()
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=use_transformer_engine, normalization="RMSNorm")
    if not use_transformer_engine:
        _packed_core_attention(spec)
    stage = GPTModel(
        config=config, transformer_layer_spec=spec, vocab_size=a.model_vocab_size, max_sequence_length=1 << 20,
        pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=not a.untie_embeddings_and_output_weights, position_embedding_type="rope",
        rotary_percent=a.rotary_percent, rotary_base=int(a.rotary_base) if float(a.rotary_base).is_integer() else a.rotary_base,
    )
    if LAYER_SPECS["local"].share_prompts(a) and not use_transformer_engine:
        from .attention import PositionalRope

        PositionalRope(stage)  # shared-prompt units place responses after other responses: RoPE from position_ids
    return stage


def _packed_core_attention(block_spec) -> None:
    """The local spec's core attention (megatron's DotProductAttention, which refuses packed rows) replaced by
    attention.PackedDotProductAttention in every layer of ``block_spec``, in place (layers of one kind share their
    submodules: a shared one is seen again, already replaced)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from .attention import PackedDotProductAttention

    for layer in block_spec.layer_specs:
        attention = layer.submodules.self_attention.submodules
        if attention.core_attention not in (DotProductAttention, PackedDotProductAttention):
            raise TypeError(f"local layer spec with core attention {attention.core_attention!r}: expected megatron's "
                            "DotProductAttention (megatron-core 0.16's get_gpt_layer_local_spec)")
        attention.core_attention = PackedDotProductAttention


def to_params_dtype(stage, dtype: torch.dtype):
    """Every parameter of ``stage`` in ``dtype``, as megatron's Float16Module makes a bf16/fp16 model (the local spec
    builds its norms in fp32 whatever params_dtype is); buffers keep theirs (the router's fp32 expert bias). -> stage."""
    with torch.no_grad():
        for p in stage.parameters():
            if p.dtype.is_floating_point and p.dtype != dtype:
                p.data = p.data.to(dtype)
    return stage

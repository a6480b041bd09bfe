"""Tiny HF models of each Megatron family (2 layers, hidden 64, random weights with non-trivial norms and
router biases) and a one-rank megatron world (gloo, TP=PP=EP=1) shared by a test module."""

from __future__ import annotations

import pytest
import torch

VOCAB = 128


def tiny_hf(kind: str, seed: int = 0, tie: bool = False, vocab: int = VOCAB, **overrides):
    """A random 2-layer HF causal LM of family ``kind`` (qwen2, qwen3, llama, glm4_moe, qwen3_moe); ``overrides`` set config fields."""
    import transformers

    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=vocab, tie_word_embeddings=tie, max_position_embeddings=256, pad_token_id=0, eos_token_id=1)
    configs = {
        "qwen2": lambda: transformers.Qwen2Config(**common),
        "qwen3": lambda: transformers.Qwen3Config(**common, head_dim=16),
        "llama": lambda: transformers.LlamaConfig(**common),
        "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**common, head_dim=16, moe_intermediate_size=32, num_experts=4,
                                                         num_experts_per_tok=2, norm_topk_prob=True),
        "glm4_moe": lambda: transformers.Glm4MoeConfig(
            **common, head_dim=16, moe_intermediate_size=32, first_k_dense_replace=1, n_routed_experts=4, n_shared_experts=1,
            num_experts_per_tok=2, routed_scaling_factor=2.5, partial_rotary_factor=0.5, use_qk_norm=True, n_group=1, topk_group=1),
    }
    torch.manual_seed(seed)
    config = configs[kind]()
    for name, value in overrides.items():
        setattr(config, name, value)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms at 1 and zero router biases would hide a mis-mapped norm or bias
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if "norm" in name or "e_score_correction_bias" in name:
                t.add_(0.1 * torch.randn_like(t))
    return model


def hf_state(model) -> dict[str, torch.Tensor]:
    """The HF state dict as a checkpoint holds it (no lm_head when tied)."""
    sd = dict(model.state_dict())
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    return sd


@pytest.fixture(scope="module")
def megatron_world():
    """A one-rank gloo world with megatron's groups (TP=PP=EP=1); torn down after the module."""
    from miles_core.config.parallel import ParallelConfig
    from miles_core.training.megatron import cpu, parallel

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    parallel.init_parallel(ParallelConfig(), seed=1234, device="cpu")
    yield
    parallel.teardown()
    cpu.uninstall()
    torch.set_num_threads(threads)

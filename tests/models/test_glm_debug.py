"""builtin://glm4-5-debug: GLM-4.5's architecture at debug size, built offline; its weights survive
the checkpoint -> HF export -> from_pretrained path the eval flow takes (fused MoE experts included)."""

from __future__ import annotations

import pytest
import torch

from miles_core.env import cache_dir
from miles_core.models import resolve_model_path


@pytest.fixture(scope="module")
def glm_dir():
    return resolve_model_path("builtin://glm4-5-debug", cache_dir())


def test_architecture_is_glm45_cut_down(glm_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(glm_dir)
    assert cfg.model_type == "glm4_moe" and cfg.architectures == ["Glm4MoeForCausalLM"]
    assert (cfg.num_hidden_layers, cfg.first_k_dense_replace, cfg.hidden_size) == (3, 1, 64)
    assert (cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_shared_experts) == (4, 2, 1)
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.5 and cfg.use_qk_norm and cfg.routed_scaling_factor == 2.5
    model = AutoModelForCausalLM.from_pretrained(glm_dir)
    layers = model.model.layers
    assert type(layers[0].mlp).__name__ == "Glm4MoeMLP"  # dense first layer
    assert all(type(layer.mlp).__name__ == "Glm4MoeMoE" and layer.mlp.shared_experts is not None for layer in layers[1:])
    assert hasattr(layers[0].self_attn, "q_norm") and hasattr(layers[1].mlp.gate, "e_score_correction_bias")


def test_checkpoint_to_hf_roundtrip_keeps_the_moe_weights(glm_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from miles_core.checkpoint import save_checkpoint
    from miles_core.checkpoint.convert import checkpoint_to_hf

    model = AutoModelForCausalLM.from_pretrained(glm_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))  # "trained": not the weights on disk
    save_checkpoint(tmp_path / "ckpt", 0, model=model, state={"weight_version": 1})
    out = checkpoint_to_hf(tmp_path / "ckpt" / "0", glm_dir, tmp_path / "export", 2)
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([AutoTokenizer.from_pretrained(out)("12+7=")["input_ids"]])
    assert torch.allclose(reloaded(ids).logits, model(ids).logits, atol=1e-5)

"""HF <-> Megatron weights: Megatron logits equal HF logits (fp32), the mapping round-trips bit-exactly,
and a checkpoint that does not fit config.json is refused naming the tensor and the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from miles_core.config.parallel import ParallelConfig
from miles_core.training.megatron import model, model_args, weights

from .conftest import VOCAB, hf_state, tiny_hf


def megatron_from_hf(hf):
    a = model_args.from_hf_config(hf.config.to_dict())
    stage = model.build_stage(a, model.transformer_config(a, ParallelConfig(), torch.float32, cpu=True)).eval()
    sd = hf_state(hf)
    weights.validate_hf(sd, a, "test")
    stage.load_state_dict(weights.shard(weights.hf_to_full(sd, a), stage), strict=False)
    return a, stage


@pytest.mark.parametrize("kind, tie, fields", [
    ("qwen2", True, {}), ("qwen3", False, {}), ("glm4_moe", False, {}), ("qwen3_moe", False, {}), ("llama", False, {}),
    ("qwen3", False, {"head_dim": 32}),  # head_dim != hidden_size / heads (Qwen3-4B: 128 vs 2560 / 32 = 80): kv_channels
    ("qwen3_moe", False, {"norm_topk_prob": False}),  # softmax over all experts, the top-k not renormalised
    ("glm4_moe", False, {"attention_bias": True}),  # q/k/v biases (GLM's o_proj has none)
])
def test_megatron_logits_equal_hf_logits(megatron_world, kind, tie, fields):
    hf = tiny_hf(kind, tie=tie, **fields)
    if fields.get("attention_bias"):  # zero-initialised biases would hide a mis-mapped one
        with torch.no_grad():
            for name, t in hf.named_parameters():
                if name.endswith("_proj.bias"):
                    t.normal_()
    a, stage = megatron_from_hf(hf)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))  # [B, S]
    causal = torch.ones(12, 12, dtype=torch.bool).triu(1)[None, None].expand(2, 1, -1, -1)  # True = masked
    with torch.no_grad():
        ref = hf(input_ids=ids).logits  # [B, S, V]
        out = stage(input_ids=ids, position_ids=torch.arange(12)[None].expand(2, -1), attention_mask=causal)
    assert out.shape == ref.shape
    assert (out - ref).abs().max() < 1e-5


@pytest.mark.parametrize("kind", ["qwen2", "glm4_moe"])
def test_round_trip_is_bit_exact(megatron_world, kind):
    hf = tiny_hf(kind, tie=kind == "qwen2")
    a, stage = megatron_from_hf(hf)
    back = weights.full_to_hf(weights.gather_full(stage), a)
    sd = hf_state(hf)
    assert set(back) == set(sd)
    assert all(torch.equal(back[k], sd[k]) for k in sd)


def test_a_checkpoint_that_does_not_fit_config_json_is_named():
    hf = tiny_hf("qwen3")
    a = model_args.from_hf_config(hf.config.to_dict())
    sd = hf_state(hf)
    with pytest.raises(ValueError, match=r"model.layers.1.self_attn.k_proj.weight is missing \(config.json num_key_value_heads"):
        weights.validate_hf({k: v for k, v in sd.items() if k != "model.layers.1.self_attn.k_proj.weight"}, a, "ckpt")
    bad = {**sd, "model.layers.0.mlp.up_proj.weight": torch.zeros(64, 64)}
    with pytest.raises(ValueError, match=r"up_proj.weight has shape \(64, 64\), config.json \(intermediate_size\) implies \(128, 64\)"):
        weights.validate_hf(bad, a, "ckpt")


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "glm4_moe"])
def test_transformer_engine_names_round_trip_bit_exactly(kind):
    """Under the TE spec's names (test data written from megatron-core 0.16.1 gpt_layer_specs.py: the norms folded
    into linear_qkv / a dense linear_fc1) every tensor maps HF -> Megatron -> HF unchanged."""
    from miles_core.training.megatron.model_args import from_hf_config
    from miles_core.training.megatron.weights import full_to_hf, hf_to_full, local_spec_name, te_spec_names

    hf = tiny_hf(kind)
    args = from_hf_config(hf.config.to_dict())
    sd = hf_state(hf)
    te = te_spec_names(hf_to_full(sd, args), args)
    assert set(te) == set((Path(__file__).parent / "data" / "te_names" / f"{kind}.txt").read_text().split())
    back = full_to_hf({local_spec_name(k): v for k, v in te.items()}, args)
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)

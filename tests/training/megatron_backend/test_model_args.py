"""Named model specs (the reference's MODEL_ARGS) against config.json files of those models' public values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from miles_core.training.megatron.model_args import NAMED, check_named, from_hf_config

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_spec_matches_its_config_json(name):
    config = json.loads((DATA / f"{name}.config.json").read_text())
    assert check_named(name, config) == NAMED[name]


def test_reference_values_of_the_large_specs():
    glm = NAMED["glm4.5-355B-A32B"]
    assert glm.moe_layer_freq == (0,) * 3 + (1,) * 89 and glm.num_experts == 160 and glm.moe_router_topk == 8
    assert (glm.rotary_percent, glm.moe_router_topk_scaling_factor, glm.moe_router_score_function) == (0.5, 2.5, "sigmoid")
    flash = NAMED["glm4.7-flash"]
    assert (flash.q_lora_rank, flash.kv_lora_rank, flash.qk_head_dim, flash.v_head_dim, flash.qk_pos_emb_head_dim) == (768, 512, 192, 256, 64)
    assert "--moe-layer-freq [0]*3+[1]*89" in glm.flags() and "--qk-layernorm" in glm.flags()


def test_a_disagreeing_config_names_the_field():
    config = json.loads((DATA / "qwen3-8B.config.json").read_text())
    with pytest.raises(ValueError, match=r"qwen3-8B disagrees with config.json: hidden_size 4096 \(config.json gives 2048\)"):
        check_named("qwen3-8B", {**config, "hidden_size": 2048})
    with pytest.raises(ValueError, match="untie_embeddings_and_output_weights True"):
        check_named("qwen3-8B", {**config, "tie_word_embeddings": True})


def test_unsupported_family_and_missing_key_are_named():
    with pytest.raises(ValueError, match="model_type 'gpt2' has no Megatron model spec"):
        from_hf_config({"model_type": "gpt2"})
    config = json.loads((DATA / "glm4.5-106B-A12B.config.json").read_text())
    del config["n_routed_experts"]
    with pytest.raises(ValueError, match="needs the config field 'n_routed_experts'"):
        from_hf_config(config)


def test_model_args_command_prints_the_flags_and_checks_a_config():
    from typer.testing import CliRunner

    from flows.cli import app

    out = CliRunner().invoke(app, ["model-args", "qwen2.5-0.5B"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert {"--num-layers 24", "--hidden-size 896", "--num-query-groups 2", "--group-query-attention", "--add-qkv-bias",
            "--rotary-base 1000000"} <= set(lines)
    assert "--untie-embeddings-and-output-weights" not in lines  # Qwen2.5-0.5B ties them
    bad = CliRunner().invoke(app, ["model-args", "qwen2.5-0.5B", "--config", str(DATA / "qwen2.5-7B.config.json")])
    assert bad.exit_code == 1 and "num_layers 24 (config.json gives 28)" in " ".join(bad.output.split())

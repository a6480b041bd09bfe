"""Named model specs (the reference's MODEL_ARGS) against config.json files of those models' public values."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from miles_core.training.megatron.model_args import NAMED, check_named, from_hf_config, reference_flags

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


REFERENCE = json.loads((DATA / "reference_model_args.json").read_text())  # tools/reference_model_args.py writes it


def _flags(line: str) -> Counter:
    """'--a 1 --b --c x' -> Counter of (flag, value); numbers compared as numbers (1e-06 == 1e-6, 1.0 == 1)."""
    tokens, out, i = line.split(), Counter(), 0
    while i < len(tokens):
        value = tokens[i + 1] if i + 1 < len(tokens) and not tokens[i + 1].startswith("--") else None
        try:
            value = float(value) if value is not None else None
        except ValueError:
            pass
        out[(tokens[i], value)] += 1
        i += 2 if value is not None else 1
    return out


@pytest.mark.parametrize("name", sorted(NAMED))
def test_model_args_prints_exactly_the_reference_arguments(name):
    from typer.testing import CliRunner

    from flows.cli import app

    out = CliRunner().invoke(app, ["model-args", name])
    assert out.exit_code == 0, out.output
    assert _flags(" ".join(out.output.splitlines())) == _flags(REFERENCE[name])


@pytest.mark.parametrize("name", [n for n, spec in NAMED.items() if not spec.num_experts])
def test_dense_specs_have_no_moe_flags(name):
    assert not [f for f in reference_flags(name) if f.startswith("--moe") or f.startswith("--num-experts")]


# (config.json, field, value) -> the refusal names the field: what the Megatron spec does not implement
REFUSED = [
    ("glm4.5-355B-A32B", "norm_topk_prob", False),
    ("glm4.5-355B-A32B", "n_group", 2),
    ("qwen3-4B", "rope_parameters", {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}),
    ("qwen3-4B", "rope_scaling", {"type": "yarn", "factor": 4.0}),
    ("qwen3-4B", "use_sliding_window", True),
    ("qwen3-4B", "layer_types", ["sliding_attention"] * 36),
    ("qwen3-4B", "hidden_act", "gelu"),
    ("qwen3-4B", "mlp_bias", True),
    ("qwen3-4B", "attention_dropout", 0.1),
    ("glm4.5-355B-A32B", "scoring_func", "softmax"),
    ("glm4.5-355B-A32B", "topk_method", "greedy"),  # the expert bias would count in the weights, not only the choice
    ("qwen3-4B", "quantization_config", {"quant_method": "fp8"}),
    ("glm4.5-355B-A32B", "moe_layer_freq", 2),  # DeepSeek's field, unknown to glm4_moe: refused, not skipped
    ("qwen3-4B", "attention_bias", True),  # qwen3's attention_bias includes o_proj
]


@pytest.mark.parametrize("spec, field, value", REFUSED, ids=[f"{s}-{f}" for s, f, _ in REFUSED])
def test_a_field_the_spec_does_not_honour_is_refused_by_name(spec, field, value):
    config = json.loads((DATA / f"{spec}.config.json").read_text())
    with pytest.raises(ValueError, match=rf"does not honour: {field}"):
        from_hf_config({**config, field: value, **({"topk_group": 1} if field == "n_group" else {})}, "config.json")


def test_the_published_configs_pass_the_field_table():
    for file in DATA.glob("*.config.json"):
        from_hf_config(json.loads(file.read_text()), file.name)  # no field refused: every published field is known


@pytest.mark.parametrize("field", ["rope_scaling", "rope_parameters"])  # the hub's Llama-3.x config.json / transformers 5's
def test_llama3_rope_scaling_on_a_llama_config_is_refused_by_name(field):
    """Finding 2 of issue 29: a Llama-3.x model (rope_type llama3) gave logits 6.27 away from HF; the field is refused."""
    from .conftest import tiny_hf

    config = tiny_hf("llama").config.to_dict()
    from_hf_config(config, "config.json")  # plain RoPE: read (its logits equal HF's in test_weights.py)
    llama3 = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}
    with pytest.raises(ValueError, match=rf"does not honour: {field}: rope_type 'llama3' \(rope scaling\).*train_backend torch"):
        from_hf_config({**config, field: llama3}, "config.json")


@pytest.mark.parametrize("name, families", [
    ("qwen2", ("qwen2", "qwen3")), ("Qwen2ForCausalLM", ("qwen2", "qwen3")), ("qwen3config", ("qwen2", "qwen3")),
    ("llama", ("llama",)), ("qwen3_moe", ("qwen3_moe",)), ("Qwen3MoeConfig", ("qwen3_moe",)), ("glm4_moe", ("glm4_moe",)),
    ("glm4moe", ("glm4_moe",)), ("glm4_moe_lite", ("glm4_moe_lite",)), ("deepseekv3", ("glm4_moe_lite",)),
])
def test_model_name_maps_to_the_families_of_its_converter_in_the_reference_order(name, families):
    from miles_core.training.megatron.model_args import families_of_name

    assert families_of_name(name) == families


@pytest.mark.parametrize("name", ["gpt2", "glm4", "qwen3next", "qwen3_5", "mimo", "kimi_k25"])
def test_a_model_name_without_a_family_is_refused_listing_the_known(name):
    from miles_core.training.megatron.model_args import families_of_name

    with pytest.raises(ValueError, match=r"model_name .* names no converter of a model family miles has; known: glm4_moe, "
                                         r"glm4_moe_lite, llama"):
        families_of_name(name)


def test_model_name_of_another_family_is_refused():
    config = json.loads((DATA / "qwen3-8B.config.json").read_text())
    assert from_hf_config(config, model_name="Qwen2ForCausalLM") == from_hf_config(config)
    with pytest.raises(ValueError, match="model_name 'glm4moe' names the converter of glm4_moe, but config.json is model_type qwen3"):
        from_hf_config(config, model_name="glm4moe")


def test_padded_for_an_explicit_size_is_checked():
    args = from_hf_config(json.loads((DATA / "qwen3-8B.config.json").read_text()))  # vocab 151936
    assert args.padded_for(2).padded_vocab_size is None and args.padded_for(3).padded_vocab_size == 151938
    assert args.padded_for(2, 152064).model_vocab_size == 152064
    assert args.padded_for(1, 151936).padded_vocab_size is None
    with pytest.raises(ValueError, match=r"padded_vocab_size \(152065\) must be >= .* a multiple of tensor_model_parallel_size \(2\)"):
        args.padded_for(2, 152065)

"""Every config.json field of a family the Megatron model spec supports: read (it drives the math), inert (it does
not change the model's outputs), or checked (a value the spec does not implement is refused, naming the field).
A field in none of the tables is refused too: a field the code does not know could change the math.

The torch backend runs transformers' own model, which honours every field; this is the Megatron path's table
(training/megatron/model_args.py reads the `read` fields; docs/models.md lists the tables). No torch import here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

# PretrainedConfig's own keys, token ids, and run-time switches: none changes a forward pass
INERT = frozenset({
    "_name_or_path", "architectures", "chunk_size_feed_forward", "dtype", "torch_dtype", "id2label", "is_encoder_decoder",
    "label2id", "model_type", "output_attentions", "output_hidden_states", "problem_type", "return_dict",
    "transformers_version", "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "use_cache",
    "max_position_embeddings",  # rope is computed for any position; only a rope scaling type reads it (checked below)
    "output_router_logits", "router_aux_loss_coef",  # the router's auxiliary loss: not part of miles' losses
    "max_window_layers",  # read by transformers only with use_sliding_window (checked)
    "pretraining_tp",  # transformers 5 ignores it (a Llama-1 pretraining artefact)
})

Check = Callable[[object, dict], str | None]  # (value, whole config) -> why it is refused, or None


def _only(*allowed, why: str) -> Check:
    return lambda value, _c: None if value in allowed else f"{value!r} is not supported ({why})"


def _rope(value, _c) -> str | None:
    rope_type = (value or {}).get("rope_type", (value or {}).get("type", "default")) if isinstance(value, dict) else value
    if rope_type in (None, "default"):
        return None
    return (f"rope_type {rope_type!r} (rope scaling) is not implemented by the Megatron model spec (only plain RoPE with "
            "rope_theta and partial_rotary_factor); train this model on train_backend torch, which runs transformers' model")


def _full_attention(value, _c) -> str | None:
    other = sorted({t for t in value or () if t != "full_attention"})
    return None if not other else f"layer types {other}: the Megatron model spec has full causal attention only"


def _groups(value, c) -> str | None:
    groups, chosen = c.get("n_group") or 1, c.get("topk_group") or 1
    if groups == 1 or chosen >= groups:
        return None
    return (f"group-limited routing (n_group {groups}, topk_group {chosen}) picks experts differently in transformers "
            "(top-2 sum per group) and megatron-core (top-k/topk_group sum per group); refused rather than approximated")


_NO_DROPOUT = _only(0, 0.0, why="the Megatron model is built without attention dropout")
_SILU = _only("silu", why="the Megatron model spec is SwiGLU")
_NO_SLIDING = _only(False, None, why="the Megatron model spec has full causal attention only")
_NORM_TOPK = _only(True, why="megatron-core's sigmoid router renormalises the chosen experts' probabilities")
# qwen3 / qwen3_moe / llama: attention_bias also puts a bias on o_proj, which megatron's add_qkv_bias does not have
_NO_O_PROJ_BIAS = _only(False, None, why="it adds an o_proj bias; the Megatron spec has q/k/v biases only (add_qkv_bias)")


@dataclass(frozen=True)
class FamilyFields:
    read: frozenset[str]
    checked: dict[str, Check] = field(default_factory=dict)


_COMMON_READ = frozenset({"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                          "vocab_size", "rms_norm_eps", "tie_word_embeddings", "rope_theta", "head_dim", "partial_rotary_factor"})
_COMMON_CHECKED: dict[str, Check] = {"rope_parameters": _rope, "rope_scaling": _rope, "hidden_act": _SILU,
                                     "attention_dropout": _NO_DROPOUT, "use_sliding_window": _NO_SLIDING,
                                     "sliding_window": lambda v, c: None if not c.get("use_sliding_window") else "sliding window",
                                     "layer_types": _full_attention, "mlp_bias": _only(False, why="the Megatron MLP has no bias")}
_MOE_CHECKED = {**_COMMON_CHECKED, "norm_topk_prob": _NORM_TOPK}
_GLM_READ = _COMMON_READ | {"attention_bias", "use_qk_norm", "moe_intermediate_size", "n_routed_experts", "n_shared_experts",
                            "num_experts_per_tok", "routed_scaling_factor", "first_k_dense_replace", "num_nextn_predict_layers"}
_GLM_CHECKED = {**_MOE_CHECKED, "n_group": _groups, "topk_group": _groups,
                "scoring_func": _only("sigmoid", why="GLM's router is sigmoid"),
                "topk_method": _only("noaux_tc", why="GLM's router adds the expert bias for the choice only")}

FAMILY_FIELDS: dict[str, FamilyFields] = {
    "qwen2": FamilyFields(read=_COMMON_READ, checked=_COMMON_CHECKED),
    "qwen3": FamilyFields(read=_COMMON_READ, checked={**_COMMON_CHECKED, "attention_bias": _NO_O_PROJ_BIAS}),
    "llama": FamilyFields(read=_COMMON_READ, checked={**_COMMON_CHECKED, "attention_bias": _NO_O_PROJ_BIAS}),
    "qwen3_moe": FamilyFields(read=_COMMON_READ | {"moe_intermediate_size", "num_experts", "num_local_experts",
                                                   "num_experts_per_tok", "decoder_sparse_step", "mlp_only_layers",
                                                   "norm_topk_prob"},  # false: moe_router_pre_softmax
                              checked={**_COMMON_CHECKED, "attention_bias": _NO_O_PROJ_BIAS}),
    "glm4_moe": FamilyFields(read=_GLM_READ, checked=_GLM_CHECKED),
    "glm4_moe_lite": FamilyFields(read=_GLM_READ | {"q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_nope_head_dim", "qk_rope_head_dim",
                                                    "v_head_dim", "mlp_layer_types", "rope_interleave"}, checked=_GLM_CHECKED),
}


def check_fields(config: dict, source: str) -> None:
    """Refuse a config.json field the family's Megatron spec does not honour, naming the field and why."""
    family = FAMILY_FIELDS[config["model_type"]]
    problems = []
    for name, value in config.items():
        if name in INERT or name in family.read:
            continue
        check = family.checked.get(name)
        if check is None:
            problems.append(f"{name} (a field the {config['model_type']} Megatron spec does not know: it could change the math)")
        elif (why := check(value, config)) is not None:
            problems.append(f"{name}: {why}")
    if problems:
        raise ValueError(f"{source}: config.json fields the Megatron model spec does not honour: " + "; ".join(problems))

"""HF <-> Megatron weights, by our own per-architecture name mapping (docs/decisions.md, 2026-12-01).

Three steps, each its own function:

    hf_to_full / full_to_hf   HF tensors <-> the whole Megatron model's tensors under their TP=PP=EP=1
                              names (q/k/v merged into linear_qkv per query group, gate/up into linear_fc1,
                              fused HF experts [E, 2I, H] <-> local_experts.<e>.linear_fc1 [2I, H])
    shard / gather            the whole tensors <-> this rank's: its PP stage's layers, its EP share of
                              the experts, its TP slice along each parameter's partition_dim
    expected_hf_shapes        what config.json implies, so a missing or mis-shaped tensor is named with
                              the config field its shape comes from

Megatron's linear_qkv rows per query group g are [q heads of g; k of g; v of g], each head kv_channels
rows; its gated linear_fc1 is [gate; up], and under TP each rank holds [gate_r; up_r].
"""

from __future__ import annotations

import re

import torch

from .model_args import ModelArgs

LAYER = re.compile(r"^(decoder\.layers\.)(\d+)(\..*)$")
# The Transformer-Engine layer spec folds a norm into the linear after it (megatron-core 0.16.1
# models/gpt/gpt_layer_specs.py: linear_qkv = backend.column_parallel_layer_norm_linear() ~248/279; a dense layer's
# linear_fc1 the same, get_mlp_module_spec_for_backend ~497; an MoE layer keeps pre_mlp_layernorm = TENorm ~265/291).
# TE name -> the local spec's name of the same tensor; the full (TP=PP=EP=1) names are always the local spec's.
TE_FOLDED_NORMS = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
                   "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight"}
EXPERT = re.compile(r"^(.*\.local_experts\.)(\d+)(\..*)$")
_ATTN = {"o_proj.weight": "linear_proj.weight", "q_norm.weight": "q_layernorm.weight", "k_norm.weight": "k_layernorm.weight"}


def _moe_layer(a: ModelArgs, i: int) -> bool:
    return bool(a.num_experts) and (a.moe_layer_freq is None or a.moe_layer_freq[i] == 1)


def expected_hf_shapes(a: ModelArgs) -> dict[str, tuple[tuple[int, ...], str]]:
    """HF tensor name -> (shape, the config.json fields that shape comes from)."""
    if a.multi_latent_attention:
        raise ValueError("multi-latent attention (glm4_moe_lite, GLM-4.7-Flash): the HF <-> Megatron weight mapping is not "
                         "supported yet (its model args are: miles model-args glm4.7-flash)")
    h, hd, nh, ng = a.hidden_size, a.kv_channels, a.num_attention_heads, a.num_query_groups
    out = {"model.embed_tokens.weight": ((a.vocab_size, h), "vocab_size, hidden_size"), "model.norm.weight": ((h,), "hidden_size")}
    if a.untie_embeddings_and_output_weights:
        out["lm_head.weight"] = ((a.vocab_size, h), "vocab_size, hidden_size, tie_word_embeddings")
    for i in range(a.num_layers):
        p = f"model.layers.{i}."
        attn = {"q_proj.weight": ((nh * hd, h), "num_attention_heads, head_dim"), "k_proj.weight": ((ng * hd, h), "num_key_value_heads, head_dim"),
                "v_proj.weight": ((ng * hd, h), "num_key_value_heads, head_dim"), "o_proj.weight": ((h, nh * hd), "hidden_size, num_attention_heads")}
        if a.add_qkv_bias:
            attn |= {"q_proj.bias": ((nh * hd,), "attention_bias"), "k_proj.bias": ((ng * hd,), "attention_bias"), "v_proj.bias": ((ng * hd,), "attention_bias")}
        if a.qk_layernorm:
            attn |= {"q_norm.weight": ((hd,), "head_dim, use_qk_norm"), "k_norm.weight": ((hd,), "head_dim, use_qk_norm")}
        out |= {p + "self_attn." + k: v for k, v in attn.items()}
        out |= {p + "input_layernorm.weight": ((h,), "hidden_size"), p + "post_attention_layernorm.weight": ((h,), "hidden_size")}
        out |= _mlp_shapes(a, i, p + "mlp.")
    return out


def _mlp_shapes(a: ModelArgs, i: int, p: str) -> dict[str, tuple[tuple[int, ...], str]]:
    h = a.hidden_size
    if not _moe_layer(a, i):
        f = a.ffn_hidden_size
        return {p + "gate_proj.weight": ((f, h), "intermediate_size"), p + "up_proj.weight": ((f, h), "intermediate_size"),
                p + "down_proj.weight": ((h, f), "intermediate_size")}
    e, f = a.num_experts, a.moe_ffn_hidden_size
    out = {p + "gate.weight": ((e, h), "num_experts"), p + "experts.gate_up_proj": ((e, 2 * f, h), "num_experts, moe_intermediate_size"),
           p + "experts.down_proj": ((e, h, f), "num_experts, moe_intermediate_size")}
    if a.moe_router_enable_expert_bias:
        out[p + "gate.e_score_correction_bias"] = ((e,), "n_routed_experts")
    if a.moe_shared_expert_intermediate_size:
        s = a.moe_shared_expert_intermediate_size
        out |= {p + "shared_experts.gate_proj.weight": ((s, h), "moe_intermediate_size, n_shared_experts"),
                p + "shared_experts.up_proj.weight": ((s, h), "moe_intermediate_size, n_shared_experts"),
                p + "shared_experts.down_proj.weight": ((h, s), "moe_intermediate_size, n_shared_experts")}
    return out


def validate_hf(hf: dict[str, torch.Tensor], a: ModelArgs, source: str) -> None:
    """Every tensor config.json implies is there with its shape, and nothing else; errors name tensor and field."""
    expected = expected_hf_shapes(a)
    for name, (shape, fields) in expected.items():
        if name not in hf:
            raise ValueError(f"{source}: tensor {name} is missing (config.json {fields} imply it)")
        if tuple(hf[name].shape) != shape:
            raise ValueError(f"{source}: tensor {name} has shape {tuple(hf[name].shape)}, config.json ({fields}) implies {shape}")
    extra = sorted(set(hf) - set(expected))
    if extra:
        raise ValueError(f"{source}: tensors config.json does not describe: {extra[:5]}{' ...' if len(extra) > 5 else ''}")


def load_hf_state(path, a: ModelArgs) -> dict[str, torch.Tensor]:
    """The HF checkpoint's tensors (fp32, the HF model's names), its files checked against config.json before any
    weight is read (checkpoint/hf_load.py), then against the Megatron model args."""
    from miles_core.checkpoint.hf_load import load_hf_state as load

    state = load(path)
    validate_hf(state, a, str(path))
    return state


def hf_to_full(hf: dict[str, torch.Tensor], a: ModelArgs) -> dict[str, torch.Tensor]:
    """HF tensors -> the whole Megatron model's tensors (TP=PP=EP=1 names)."""
    out = {"embedding.word_embeddings.weight": _pad_rows(hf["model.embed_tokens.weight"], a.model_vocab_size),
           "decoder.final_layernorm.weight": hf["model.norm.weight"]}
    if a.untie_embeddings_and_output_weights:
        out["output_layer.weight"] = _pad_rows(hf["lm_head.weight"], a.model_vocab_size)
    for i in range(a.num_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        out[dst + "input_layernorm.weight"] = hf[src + "input_layernorm.weight"]
        out[dst + "pre_mlp_layernorm.weight"] = hf[src + "post_attention_layernorm.weight"]
        for k, v in _ATTN.items():
            if src + "self_attn." + k in hf:
                out[dst + "self_attention." + v] = hf[src + "self_attn." + k]
        for kind in ("weight", "bias"):
            if src + f"self_attn.q_proj.{kind}" in hf:
                q, k_, v_ = (hf[src + f"self_attn.{n}_proj.{kind}"] for n in "qkv")
                out[dst + f"self_attention.linear_qkv.{kind}"] = _merge_qkv(q, k_, v_, a)
        out |= _mlp_to_full(hf, a, i, src + "mlp.", dst + "mlp.")
    return out


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """[V, H] -> [rows, H], zero rows appended (the padded vocab)."""
    return t if t.shape[0] == rows else torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])


def _mlp_to_full(hf, a: ModelArgs, i: int, src: str, dst: str) -> dict[str, torch.Tensor]:
    if not _moe_layer(a, i):
        return {dst + "linear_fc1.weight": torch.cat([hf[src + "gate_proj.weight"], hf[src + "up_proj.weight"]]),
                dst + "linear_fc2.weight": hf[src + "down_proj.weight"]}
    out = {dst + "router.weight": hf[src + "gate.weight"]}
    if src + "gate.e_score_correction_bias" in hf:
        out[dst + "router.expert_bias"] = hf[src + "gate.e_score_correction_bias"]
    for e in range(a.num_experts):
        out[dst + f"experts.local_experts.{e}.linear_fc1.weight"] = hf[src + "experts.gate_up_proj"][e]
        out[dst + f"experts.local_experts.{e}.linear_fc2.weight"] = hf[src + "experts.down_proj"][e]
    if src + "shared_experts.gate_proj.weight" in hf:
        out[dst + "shared_experts.linear_fc1.weight"] = torch.cat([hf[src + "shared_experts.gate_proj.weight"], hf[src + "shared_experts.up_proj.weight"]])
        out[dst + "shared_experts.linear_fc2.weight"] = hf[src + "shared_experts.down_proj.weight"]
    return out


def _merge_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: ModelArgs) -> torch.Tensor:
    ng, hd, per = a.num_query_groups, a.kv_channels, a.num_attention_heads // a.num_query_groups
    rest = q.shape[1:]
    groups = [q.reshape(ng, per * hd, *rest), k.reshape(ng, hd, *rest), v.reshape(ng, hd, *rest)]
    return torch.cat(groups, dim=1).reshape(-1, *rest)  # [ng * (per + 2) * hd, ...]


def _split_qkv(qkv: torch.Tensor, a: ModelArgs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ng, hd, per = a.num_query_groups, a.kv_channels, a.num_attention_heads // a.num_query_groups
    rest = qkv.shape[1:]
    q, k, v = qkv.reshape(ng, (per + 2) * hd, *rest).split([per * hd, hd, hd], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def full_to_hf(full: dict[str, torch.Tensor], a: ModelArgs) -> dict[str, torch.Tensor]:
    """The inverse of hf_to_full (exact: only reshapes, splits and concatenations)."""
    out = {"model.embed_tokens.weight": full["embedding.word_embeddings.weight"][: a.vocab_size],
           "model.norm.weight": full["decoder.final_layernorm.weight"]}
    if a.untie_embeddings_and_output_weights:
        out["lm_head.weight"] = full["output_layer.weight"][: a.vocab_size]
    for i in range(a.num_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        out[dst + "input_layernorm.weight"] = full[src + "input_layernorm.weight"]
        out[dst + "post_attention_layernorm.weight"] = full[src + "pre_mlp_layernorm.weight"]
        for k, v in _ATTN.items():
            if src + "self_attention." + v in full:
                out[dst + "self_attn." + k] = full[src + "self_attention." + v]
        for kind in ("weight", "bias"):
            if src + f"self_attention.linear_qkv.{kind}" in full:
                for n, t in zip("qkv", _split_qkv(full[src + f"self_attention.linear_qkv.{kind}"], a)):
                    out[dst + f"self_attn.{n}_proj.{kind}"] = t.contiguous()
        out |= _mlp_to_hf(full, a, i, src + "mlp.", dst + "mlp.")
    return out


def _mlp_to_hf(full, a: ModelArgs, i: int, src: str, dst: str) -> dict[str, torch.Tensor]:
    if not _moe_layer(a, i):
        gate, up = full[src + "linear_fc1.weight"].chunk(2)
        return {dst + "gate_proj.weight": gate.contiguous(), dst + "up_proj.weight": up.contiguous(), dst + "down_proj.weight": full[src + "linear_fc2.weight"]}
    out = {dst + "gate.weight": full[src + "router.weight"]}
    if src + "router.expert_bias" in full:
        out[dst + "gate.e_score_correction_bias"] = full[src + "router.expert_bias"]
    experts = range(a.num_experts)
    out[dst + "experts.gate_up_proj"] = torch.stack([full[src + f"experts.local_experts.{e}.linear_fc1.weight"] for e in experts])
    out[dst + "experts.down_proj"] = torch.stack([full[src + f"experts.local_experts.{e}.linear_fc2.weight"] for e in experts])
    if src + "shared_experts.linear_fc1.weight" in full:
        gate, up = full[src + "shared_experts.linear_fc1.weight"].chunk(2)
        out |= {dst + "shared_experts.gate_proj.weight": gate.contiguous(), dst + "shared_experts.up_proj.weight": up.contiguous(),
                dst + "shared_experts.down_proj.weight": full[src + "shared_experts.linear_fc2.weight"]}
    return out


# ---- this rank's share ---------------------------------------------------------------------------
def local_tensors(model) -> dict[str, torch.Tensor]:
    """This stage's parameters and buffers by local name (no _extra_state, no LoRA adapters: megatron/lora.py)."""
    from miles_core.training.lora import is_adapter

    return {k: v for k, v in model.state_dict(keep_vars=True).items() if not k.endswith("_extra_state") and not is_adapter(k)}


def local_spec_name(name: str) -> str:
    """A parameter name under either layer spec -> the local spec's (TE's folded norms unfolded, a LoRA-wrapped
    layer's ``base_layer.`` dropped)."""
    name = name.replace(".base_layer.", ".")
    for te, local in TE_FOLDED_NORMS.items():
        if name.endswith("." + te):
            return name[: -len(te)] + local
    return name


def te_spec_names(full: dict[str, torch.Tensor], a: ModelArgs) -> dict[str, torch.Tensor]:
    """The whole model's tensors under the TE spec's names (the inverse of local_spec_name): input_layernorm into
    linear_qkv, and a dense layer's pre_mlp_layernorm into linear_fc1 (an MoE layer keeps its own norm)."""
    out = {}
    for name, t in full.items():
        m = LAYER.match(name)
        if m and m.group(3) == ".input_layernorm.weight":
            name = f"{m.group(1)}{m.group(2)}.self_attention.linear_qkv.layer_norm_weight"
        elif m and m.group(3) == ".pre_mlp_layernorm.weight" and not _moe_layer(a, int(m.group(2))):
            name = f"{m.group(1)}{m.group(2)}.mlp.linear_fc1.layer_norm_weight"
        out[name] = t
    return out


def global_name(model, name: str) -> str:
    """A local name -> its TP=PP=EP=1 name under the local spec: the stage's layer offset and the rank's first
    expert added, TE's folded norms unfolded."""
    from megatron.core import parallel_state as ps

    name = local_spec_name(name)
    m = LAYER.match(name)
    if m:
        layer = model.decoder.layers[int(m.group(2))]
        name = f"{m.group(1)}{layer.layer_number - 1}{m.group(3)}"
    m = EXPERT.match(name)
    if m:
        per_rank = model.config.num_moe_experts // ps.get_expert_model_parallel_world_size()
        name = f"{m.group(1)}{int(m.group(2)) + ps.get_expert_model_parallel_rank() * per_rank}{m.group(3)}"
    return name


def _tp(name: str) -> tuple[int, int, object]:
    """(rank, size, group) of the tensor-parallel group a parameter is split over (expert TP for experts)."""
    from megatron.core import parallel_state as ps

    if ".local_experts." in name:
        return ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size(), ps.get_expert_tensor_parallel_group()
    return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_group()


def _split(t: torch.Tensor) -> bool:
    return bool(getattr(t, "tensor_model_parallel", False))


def shard(full: dict[str, torch.Tensor], model) -> dict[str, torch.Tensor]:
    """The whole model's tensors -> this rank's (local names, its TP slice)."""
    out = {}
    for name, t in local_tensors(model).items():
        whole = full[_tied(model, global_name(model, name))]
        rank, size, _ = _tp(name)
        if _split(t) and size > 1:
            pieces = whole.chunk(2) if local_spec_name(name).endswith("linear_fc1.weight") else (whole,)
            whole = torch.cat([p.chunk(size, dim=t.partition_dim)[rank] for p in pieces], dim=t.partition_dim)
        if tuple(whole.shape) != tuple(t.shape):
            raise ValueError(f"tensor {global_name(model, name)}: shape {tuple(whole.shape)} does not fit this rank's {tuple(t.shape)}")
        out[name] = whole
    return out


def gather(model) -> dict[str, torch.Tensor]:
    """This rank's tensors, TP slices gathered, under TP=PP=EP=1 names (this stage and expert share only)."""
    import torch.distributed as dist

    out = {}
    for name, param in local_tensors(model).items():
        t = param.detach()
        rank, size, group = _tp(name)
        if _split(param) and size > 1:
            parts = [torch.empty_like(t) for _ in range(size)]
            dist.all_gather(parts, t.contiguous(), group=group)
            if local_spec_name(name).endswith("linear_fc1.weight"):
                halves = [p.chunk(2) for p in parts]
                t = torch.cat([torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])])
            else:
                t = torch.cat(parts, dim=param.partition_dim)
        if _tied(model, global_name(model, name)) == global_name(model, name):
            out[global_name(model, name)] = t.clone()
    return out


def _tied(model, name: str) -> str:
    """With tied embeddings the last stage's output_layer.weight is a copy of the word embeddings."""
    if name == "output_layer.weight" and model.share_embeddings_and_output_weights:
        return "embedding.word_embeddings.weight"
    return name


def gather_full(model) -> dict[str, torch.Tensor]:
    """The whole model's tensors on every rank (each rank's gather, exchanged over the world)."""
    import torch.distributed as dist

    mine = gather(model)
    if dist.get_world_size() == 1:
        return mine
    everyone: list[dict] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(everyone, mine)
    return {k: v for part in everyone for k, v in part.items()}

"""Model arguments in Megatron's vocabulary, from an HF config.json or by the reference's names.

``ModelArgs`` holds what Megatron's GPT model needs (the fields are the reference's MODEL_ARGS flags,
``--num-query-groups`` -> ``num_query_groups``). ``from_hf_config`` reads them from a config.json
of a supported family (FAMILIES: qwen2 / qwen2.5, qwen3, llama, qwen3_moe, glm4_moe, glm4_moe_lite);
``NAMED`` holds the reference's named specs (scripts/models/<name>.py), ``STYLES`` how the reference's script
writes each beside its math (``reference_flags``: what ``miles model-args`` prints), and ``check_named`` compares a
named spec with a config.json field by field. No megatron import here (config-load time).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace


@dataclass(frozen=True)
class ModelArgs:
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    vocab_size: int
    norm_epsilon: float = 1e-6
    rotary_base: float = 10000.0
    rotary_percent: float = 1.0
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    untie_embeddings_and_output_weights: bool = False
    # MoE (num_experts 0 = dense); moe_layer_freq: 1 = MoE layer, 0 = dense, one entry per layer
    num_experts: int = 0
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    moe_router_topk: int = 2
    moe_router_score_function: str = "softmax"
    moe_router_enable_expert_bias: bool = False
    moe_router_pre_softmax: bool = False  # softmax over all experts before the top-k (HF norm_topk_prob false)
    moe_router_topk_scaling_factor: float | None = None
    moe_layer_freq: tuple[int, ...] | None = None
    # multi-latent attention (glm4.7-flash)
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_head_dim: int | None = None
    v_head_dim: int | None = None
    qk_pos_emb_head_dim: int | None = None
    mtp_num_layers: int | None = None
    # the embedding and output rows the Megatron model holds: vocab_size rounded up to a multiple of TP (the
    # reference's --padded-vocab-size); None = vocab_size. The extra rows are zeros, masked out of every softmax.
    padded_vocab_size: int | None = None

    @property
    def model_vocab_size(self) -> int:
        return self.padded_vocab_size or self.vocab_size

    def padded_for(self, tensor_model_parallel_size: int, padded_vocab_size: int | None = None) -> "ModelArgs":
        """These args with the vocab padded to a multiple of tensor_model_parallel_size (unchanged when it divides), or
        to ``padded_vocab_size`` (the config field) when given: at least vocab_size and a multiple of the TP size."""
        tp = tensor_model_parallel_size
        padded = -(-self.vocab_size // tp) * tp
        if padded_vocab_size is not None:
            if padded_vocab_size < self.vocab_size or padded_vocab_size % tp:
                raise ValueError(f"padded_vocab_size ({padded_vocab_size}) must be >= the model's vocab_size ({self.vocab_size}) "
                                 f"and a multiple of tensor_model_parallel_size ({tp}); e.g. {padded}, or drop it")
            padded = padded_vocab_size
        return replace(self, padded_vocab_size=padded if padded != self.vocab_size else None)

    def flags(self) -> list[str]:
        """The model's math as Megatron-LM flags (``--num-layers 24 ...``): every field that is set; MoE router flags only
        for an MoE model (a dense model has no router)."""
        out: list[str] = ["--swiglu", "--disable-bias-linear", "--normalization RMSNorm", "--position-embedding-type rope"]
        if self.num_query_groups < self.num_attention_heads:
            out.append("--group-query-attention")
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value is False or (f.name in MOE_FIELDS and not self.num_experts):
                continue
            flag = "--" + f.name.replace("_", "-")
            if value is True:
                out.append(flag)
            elif f.name == "moe_layer_freq":
                out.append(f"{flag} {_freq_expr(value)}")
            else:
                out.append(f"{flag} {_number(value)}")
        return out


MOE_FIELDS = frozenset({"num_experts", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_router_topk",
                        "moe_router_score_function", "moe_router_enable_expert_bias", "moe_router_pre_softmax",
                        "moe_router_topk_scaling_factor",
                        "moe_layer_freq"})


def _number(value) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _freq_expr(freq: tuple[int, ...]) -> str:
    """`[0]*3+[1]*89` for dense-then-MoE (the reference's GLM scripts), else the list `[1,1,...]` (its
    model_args_utils.moe_layer_freq)."""
    dense = freq.index(1) if 1 in freq else len(freq)
    if dense and all(freq[dense:]):
        return f"[0]*{dense}+[1]*{len(freq) - dense}"
    return "[" + ",".join(map(str, freq)) + "]"


def _dense_then_moe(dense: int, layers: int) -> tuple[int, ...]:
    return tuple([0] * dense + [1] * (layers - dense))


def _rope(c: dict) -> tuple[float, float]:
    """(rotary base, rotary percent): transformers 5 keeps them under rope_parameters, older configs at top level."""
    rp = c.get("rope_parameters") or {}
    base = rp.get("rope_theta", c.get("rope_theta", 10000.0))
    percent = rp.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0))
    return float(base), float(percent)


def _common(c: dict) -> dict:
    heads = c["num_attention_heads"]
    base, percent = _rope(c)
    return dict(
        num_layers=c["num_hidden_layers"], hidden_size=c["hidden_size"], ffn_hidden_size=c["intermediate_size"],
        num_attention_heads=heads, num_query_groups=c.get("num_key_value_heads") or heads,
        kv_channels=c.get("head_dim") or c["hidden_size"] // heads, vocab_size=c["vocab_size"],
        norm_epsilon=float(c.get("rms_norm_eps", 1e-6)), rotary_base=base, rotary_percent=percent,
        untie_embeddings_and_output_weights=not c.get("tie_word_embeddings", False),
    )


def _qwen2(c: dict) -> ModelArgs:
    return ModelArgs(**_common(c), add_qkv_bias=True)


def _qwen3(c: dict) -> ModelArgs:
    return ModelArgs(**_common(c), qk_layernorm=True)


def _llama(c: dict) -> ModelArgs:
    return ModelArgs(**_common(c))  # attention_bias: refused when true (models/hf_fields.py)


def _qwen3_moe(c: dict) -> ModelArgs:
    sparse = [0 if i in (c.get("mlp_only_layers") or []) or (i + 1) % c.get("decoder_sparse_step", 1) else 1
              for i in range(c["num_hidden_layers"])]
    experts = c["num_experts"] if "num_experts" in c else c["num_local_experts"]  # transformers 5 writes num_local_experts
    return replace(_qwen3(c), num_experts=experts, moe_ffn_hidden_size=c["moe_intermediate_size"],
                   moe_router_topk=c["num_experts_per_tok"], moe_layer_freq=tuple(sparse),
                   moe_router_pre_softmax=not c.get("norm_topk_prob", False))  # transformers' default: False


def _glm_moe_fields(c: dict) -> dict:
    scale = float(c.get("routed_scaling_factor", 1.0))
    return dict(
        num_experts=c["n_routed_experts"], moe_ffn_hidden_size=c["moe_intermediate_size"],
        moe_shared_expert_intermediate_size=c["moe_intermediate_size"] * c.get("n_shared_experts", 1) or None,
        moe_router_topk=c["num_experts_per_tok"], moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
        moe_router_topk_scaling_factor=scale if scale != 1.0 else None,
        moe_layer_freq=_dense_then_moe(c.get("first_k_dense_replace", 0), c["num_hidden_layers"]),
        mtp_num_layers=c.get("num_nextn_predict_layers") or None,
    )


def _glm4_moe(c: dict) -> ModelArgs:
    return ModelArgs(**_common(c), add_qkv_bias=bool(c.get("attention_bias", True)), qk_layernorm=bool(c.get("use_qk_norm", False)),
                     **_glm_moe_fields(c))


def _glm4_moe_lite(c: dict) -> ModelArgs:
    """GLM-4.7-Flash: MLA attention (q/kv low-rank projections, a rope part of each head) + GLM MoE."""
    base = _common({**c, "head_dim": c["qk_nope_head_dim"]})  # the reference: --kv-channels = --qk-head-dim
    return ModelArgs(**base, add_qkv_bias=bool(c.get("attention_bias", True)), qk_layernorm=True, **_glm_moe_fields(c),
                     multi_latent_attention=True, q_lora_rank=c["q_lora_rank"], kv_lora_rank=c["kv_lora_rank"],
                     qk_head_dim=c["qk_nope_head_dim"], v_head_dim=c["v_head_dim"], qk_pos_emb_head_dim=c["qk_rope_head_dim"])


FAMILIES = {"qwen2": _qwen2, "qwen3": _qwen3, "llama": _llama, "qwen3_moe": _qwen3_moe, "glm4_moe": _glm4_moe,
            "glm4_moe_lite": _glm4_moe_lite}


# model_name (the reference's --model-name) names the reference's Megatron-to-HF converter: its dispatch
# (megatron_to_hf/__init__.py, _convert_to_hf_core) takes the first substring match of the lowercased name, in this
# order (here also without "_" / "-"); each converter -> the FAMILIES it serves (qwen2 and qwen3 share one; the
# deepseekv3 one serves glm4_moe_lite); () = a converter miles has no family for. The reference's default name is the
# HF config class's (qwen2config).
NAME_CONVERTERS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("glm4moelite", "deepseekv3", "glmmoedsa"), ("glm4_moe_lite",)), (("glm4moe",), ("glm4_moe",)), (("glm4",), ()),
    (("qwen3moe",), ("qwen3_moe",)), (("qwen3next",), ()), (("qwen35", "qwen36"), ()), (("qwen2", "qwen3"), ("qwen2", "qwen3")),
    (("deepseekv4",), ()), (("inkling",), ()), (("llama",), ("llama",)), (("mimo",), ()), (("kimivl",), ()), (("kimik25",), ()),
)


def families_of_name(model_name: str) -> tuple[str, ...]:
    """model_name -> the FAMILIES its converter serves (NAME_CONVERTERS); ValueError naming the field and the known."""
    key = model_name.lower().replace("_", "").replace("-", "")
    for parts, families in NAME_CONVERTERS:
        if any(p.replace("_", "") in key for p in parts):
            if families:
                return families
            break
    raise ValueError(f"model_name {model_name!r} names no converter of a model family miles has; known: "
                     f"{', '.join(sorted(FAMILIES))} (or a name containing one, e.g. Qwen2ForCausalLM, glm4moe, deepseekv3), "
                     "or drop model_name (the converter of config.json's model_type)")


def from_hf_config(config: dict, source: str = "config.json", model_name: str | None = None) -> ModelArgs:
    """config.json (as a dict) -> ModelArgs; an unsupported model_type or a missing key names it. ``model_name`` (the
    config field) names the converter: it must serve config.json's model_type, whose HF model the weights load into
    (checkpoint/hf_load.py builds it from config.json), else ValueError naming both."""
    if model_name is not None:
        families, declared = families_of_name(model_name), config.get("model_type")
        if declared in FAMILIES and declared not in families:
            raise ValueError(f"model_name {model_name!r} names the converter of {', '.join(families)}, but {source} is "
                             f"model_type {declared}, whose weights it would mis-map: drop model_name, or name {declared}")
    kind = config.get("model_type")
    if kind not in FAMILIES:
        raise ValueError(f"{source}: model_type {kind!r} has no Megatron model spec; supported: {sorted(FAMILIES)}")
    from miles_core.models.hf_fields import check_fields

    check_fields(config, source)  # every field read, inert, or refused by name (models/hf_fields.py)
    try:
        return FAMILIES[kind](config)
    except KeyError as e:
        raise ValueError(f"{source}: model_type {kind} needs the config field {e.args[0]!r}") from None


_QWEN = dict(norm_epsilon=1e-6, rotary_base=1e6)
_GLM_MOE = dict(add_qkv_bias=True, rotary_base=1e6, rotary_percent=0.5, norm_epsilon=1e-5, untie_embeddings_and_output_weights=True,
                moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True, moe_router_topk=8, vocab_size=151552,
                num_query_groups=8, kv_channels=128, num_attention_heads=96, mtp_num_layers=1)

# The reference's scripts/models/<name>.sh, in ModelArgs fields. Norm epsilon, where a script leaves it
# to Megatron's default, is the model's published rms_norm_eps.
NAMED: dict[str, ModelArgs] = {
    "qwen2.5-0.5B": ModelArgs(num_layers=24, hidden_size=896, ffn_hidden_size=4864, num_attention_heads=14, num_query_groups=2,
                              kv_channels=64, vocab_size=151936, add_qkv_bias=True, **_QWEN),
    "qwen2.5-7B": ModelArgs(num_layers=28, hidden_size=3584, ffn_hidden_size=18944, num_attention_heads=28, num_query_groups=4,
                            kv_channels=128, vocab_size=152064, add_qkv_bias=True, untie_embeddings_and_output_weights=True, **_QWEN),
    "qwen3-0.6B": ModelArgs(num_layers=28, hidden_size=1024, ffn_hidden_size=3072, num_attention_heads=16, num_query_groups=8,
                            kv_channels=128, vocab_size=151936, qk_layernorm=True, **_QWEN),
    "qwen3-4B": ModelArgs(num_layers=36, hidden_size=2560, ffn_hidden_size=9728, num_attention_heads=32, num_query_groups=8,
                          kv_channels=128, vocab_size=151936, qk_layernorm=True, **_QWEN),
    "qwen3-8B": ModelArgs(num_layers=36, hidden_size=4096, ffn_hidden_size=12288, num_attention_heads=32, num_query_groups=8,
                          kv_channels=128, vocab_size=151936, qk_layernorm=True, untie_embeddings_and_output_weights=True, **_QWEN),
    "qwen3-30B-A3B": ModelArgs(num_layers=48, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=32, num_query_groups=4,
                               kv_channels=128, vocab_size=151936, qk_layernorm=True, untie_embeddings_and_output_weights=True,
                               num_experts=128, moe_ffn_hidden_size=768, moe_router_topk=8, moe_layer_freq=(1,) * 48, **_QWEN),
    "glm4.5-355B-A32B": ModelArgs(num_layers=92, hidden_size=5120, ffn_hidden_size=12288, qk_layernorm=True, num_experts=160,
                                  moe_ffn_hidden_size=1536, moe_shared_expert_intermediate_size=1536,
                                  moe_router_topk_scaling_factor=2.5, moe_layer_freq=_dense_then_moe(3, 92), **_GLM_MOE),
    "glm4.5-106B-A12B": ModelArgs(num_layers=46, hidden_size=4096, ffn_hidden_size=10944, num_experts=128,
                                  moe_ffn_hidden_size=1408, moe_shared_expert_intermediate_size=1408,
                                  moe_layer_freq=_dense_then_moe(1, 46), **_GLM_MOE),
    "glm4.7-flash": ModelArgs(num_layers=47, hidden_size=2048, ffn_hidden_size=10240, num_attention_heads=20, num_query_groups=20,
                              kv_channels=192, vocab_size=154880, norm_epsilon=1e-5, rotary_base=1e6, add_qkv_bias=True,
                              qk_layernorm=True, untie_embeddings_and_output_weights=True, num_experts=64, moe_ffn_hidden_size=1536,
                              moe_shared_expert_intermediate_size=1536, moe_router_topk=4, moe_router_score_function="sigmoid",
                              moe_router_enable_expert_bias=True, moe_router_topk_scaling_factor=1.8,
                              moe_layer_freq=_dense_then_moe(1, 47), multi_latent_attention=True, q_lora_rank=768,
                              kv_lora_rank=512, qk_head_dim=192, v_head_dim=256, qk_pos_emb_head_dim=64, mtp_num_layers=1),
}


@dataclass(frozen=True)
class FlagStyle:
    """How the reference's scripts/models/<name> writes a spec beside the model's math (ModelArgs.flags()): the
    flags it leaves to Megatron-LM's defaults or does not train (implicit), and its settings that are not the model
    (token dispatcher, kernels, router training, rope spelling: extra)."""

    implicit: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()

    def apply(self, flags: list[str]) -> list[str]:
        return [f for f in flags if f.split()[0] not in self.implicit] + list(self.extra)


_QWEN_DENSE = FlagStyle(implicit=("--position-embedding-type", "--rotary-percent"), extra=("--use-rotary-position-embeddings",))
_QWEN25 = replace(_QWEN_DENSE, implicit=(*_QWEN_DENSE.implicit, "--kv-channels"))
_MOE_KERNELS = ("--moe-token-dispatcher-type alltoall", "--moe-grouped-gemm", "--moe-router-dtype fp32", "--moe-permute-fusion",
                "--moe-aux-loss-coeff 0")
_GLM_ROUTER = ("--moe-router-pre-softmax", "--moe-router-bias-update-rate 0", "--moe-router-load-balancing-type seq_aux_loss")
STYLES: dict[str, FlagStyle] = {
    "qwen2.5-0.5B": _QWEN25, "qwen2.5-7B": _QWEN25,
    "qwen3-0.6B": _QWEN_DENSE, "qwen3-4B": _QWEN_DENSE, "qwen3-8B": _QWEN_DENSE,
    "qwen3-30B-A3B": FlagStyle(extra=(*_MOE_KERNELS, "--moe-token-drop-policy probs")),
    "glm4.5-355B-A32B": FlagStyle(implicit=("--mtp-num-layers", "--norm-epsilon"), extra=(*_GLM_ROUTER, *_MOE_KERNELS)),
    "glm4.5-106B-A12B": FlagStyle(implicit=("--mtp-num-layers", "--norm-epsilon"), extra=(*_GLM_ROUTER, *_MOE_KERNELS)),
    "glm4.7-flash": FlagStyle(implicit=("--num-query-groups", "--rotary-percent", "--position-embedding-type"),
                              extra=(*_GLM_ROUTER, *_MOE_KERNELS[1:], "--position-embedding-type rope", "--make-vocab-size-divisible-by 64",
                                     "--no-position-embedding", "--no-rope-fusion")),
}


def reference_flags(name: str) -> list[str]:
    """The reference's MODEL_ARGS for a named spec: its math (ModelArgs.flags()) in the reference script's style."""
    return STYLES[name].apply(named(name).flags())


def named(name: str) -> ModelArgs:
    if name not in NAMED:
        raise ValueError(f"unknown model spec {name!r}; valid: {sorted(NAMED)}")
    return NAMED[name]


def check_named(name: str, config: dict, source: str = "config.json") -> ModelArgs:
    """The named spec, after checking that config.json describes the same model; a difference names the field."""
    spec, found = named(name), from_hf_config(config, source)
    diffs = [f"{k} {v!r} (config.json gives {asdict(found)[k]!r})" for k, v in asdict(spec).items() if asdict(found)[k] != v]
    if diffs:
        raise ValueError(f"model spec {name} disagrees with {source}: " + "; ".join(diffs))
    return spec

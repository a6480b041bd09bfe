"""Layer-reduced, randomly initialised GLM-4.5-architecture models, built offline for debug runs of
the glm4-5 recipe on CPU (``builtin://glm4-5-debug``).

The architecture is transformers' ``Glm4MoeForCausalLM``, with what makes GLM-4.5 GLM-4.5 kept
and only the sizes cut (REFERENCE §6, glm4.5-355B-A32B -> debug):

    layers            92 = 3 dense + 89 MoE        -> 3 = 1 dense (first_k_dense_replace) + 2 MoE
    hidden / ffn      5120 / 12288                 -> 64 / 128
    heads / groups    96 / 8 (kv channels 128)     -> 4 / 2 (head dim 16)
    experts           160 routed, top-k 8, 1 shared, moe ffn 1536  -> 4 routed, top-k 2, 1 shared, moe ffn 32
    router            sigmoid with expert bias, top-k scaling 2.5  (kept)
    rotary            base 1e6, rotary percent 0.5 (partial rotary)  (kept)
    qk-norm           on (kept)
    vocab             151552                       -> a BPE tokenizer trained here on the arith task (512)
    MTP layers        1                            -> 0 (transformers does not run them)

No warm-up: the weights are random, so rewards start at ~0. This model exercises the recipe's
plumbing (MoE weights through sync, checkpoint, export), not learning.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from miles_core.data.tasks import BUILTIN_TASKS, format_answer
from miles_core.models.tokenizer import publish_model_dir, train_tokenizer


@dataclass(frozen=True)
class GlmDebugSpec:
    num_hidden_layers: int = 3
    first_k_dense_replace: int = 1
    hidden_size: int = 64
    intermediate_size: int = 128
    moe_intermediate_size: int = 32
    n_routed_experts: int = 4
    num_experts_per_tok: int = 2
    n_shared_experts: int = 1
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    partial_rotary_factor: float = 0.5
    rope_theta: float = 1.0e6
    use_qk_norm: bool = True
    routed_scaling_factor: float = 2.5
    vocab_size: int = 512
    max_position_embeddings: int = 512
    task: str = "arith"
    seed: int = 0

    def fingerprint(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True) + "glm-v1"
        return hashlib.sha256(blob.encode()).hexdigest()[:10]


GLM_MODELS: dict[str, GlmDebugSpec] = {"glm4-5-debug": GlmDebugSpec()}


def glm_config(spec: GlmDebugSpec, tokenizer):
    from transformers import Glm4MoeConfig

    config = Glm4MoeConfig(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers, first_k_dense_replace=spec.first_k_dense_replace,
        moe_intermediate_size=spec.moe_intermediate_size, n_routed_experts=spec.n_routed_experts,
        num_experts_per_tok=spec.num_experts_per_tok, n_shared_experts=spec.n_shared_experts,
        num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.num_key_value_heads,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta, "partial_rotary_factor": spec.partial_rotary_factor},
        use_qk_norm=spec.use_qk_norm, routed_scaling_factor=spec.routed_scaling_factor, norm_topk_prob=True, n_group=1,
        topk_group=1, max_position_embeddings=spec.max_position_embeddings, tie_word_embeddings=False, num_mtp_layers=0,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    config.head_dim = spec.head_dim
    return config


def build_glm_debug(spec: GlmDebugSpec, out: Path) -> Path:
    """Tokenizer + random init, saved as an HF dir at ``out`` (atomically)."""
    from transformers import Glm4MoeForCausalLM

    rows = BUILTIN_TASKS[spec.task].rows()
    tok = train_tokenizer([r["input"] + format_answer(r["label"]) for r in rows], spec.vocab_size)
    torch.manual_seed(spec.seed)
    model = Glm4MoeForCausalLM(glm_config(spec, tok))
    return publish_model_dir(model, tok, out)

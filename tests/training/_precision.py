"""The bf16 acceptance check shared by both trainers' tests: a bf16 run's update of its fp32 main weights agrees,
tensor by tensor, with an fp32 run's update from the same (bf16-representable) weights.

The model is a Qwen3 (no attention biases): a key bias has an exactly zero gradient (softmax is invariant to a
shift shared by all keys), so in any precision its AdamW update is the sign of rounding noise, and Qwen2's fused
or separate k bias has no direction for two runs to agree on."""

from __future__ import annotations

from pathlib import Path

import torch

LR = 1e-6
STEPS = 10  # ten rollouts of one optimizer step each


def bf16_qwen3(path: Path, vocab: int) -> Path:
    """A random 2-layer Qwen3 saved in bfloat16 (so both runs start from exactly the same weights)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                                      tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=1)
    model = transformers.Qwen3ForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():  # norms at exactly 1 would hide a norm whose update is lost
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    return path


def train(trainer, samples) -> None:
    rewards = [s.reward for s in samples]
    for i in range(STEPS):
        trainer.train_rollout(samples, rewards, rollout_id=i)


def disagreements(update: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> list[str]:
    """Per tensor: the bf16 update is non-zero, cosine > 0.95 with the fp32 update (> 0.85 for a tensor of under 256
    entries), norm within 0.8-1.25x of it. Adam moves every entry by about lr a step whatever its gradient's size, so
    an entry whose gradient is at bf16's rounding level moves either way: in the 32-entry norm weights one or two such
    entries take the cosine to 0.90-0.95 (measured for the Megatron trainer over sample seeds 1-8, with and without
    its output layer at the response positions only: 0.899-0.951 in one norm weight at seeds 1 and 2, >= 0.99 in
    every other tensor and seed; norm ratios 0.98-1.02). An update lost or in a wrong direction gives ~0."""
    assert update.keys() == reference.keys()
    bad = []
    for name, u in update.items():
        u, r = u.double().flatten(), reference[name].double().flatten()
        if not u.count_nonzero():
            bad.append(f"{name}: unchanged")
            continue
        cos, ratio = float(torch.nn.functional.cosine_similarity(u, r, dim=0)), float(u.norm() / r.norm())
        if cos <= (0.95 if u.numel() >= 256 else 0.85) or not 0.8 <= ratio <= 1.25:
            bad.append(f"{name}: cosine {cos:.3f}, norm ratio {ratio:.3f}")
    return bad

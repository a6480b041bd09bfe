"""Built-in models, built offline: ``builtin://tiny-qwen2`` is a ~3M-parameter Qwen2 with a
locally trained tokenizer and a short supervised warm-up on the ``arith`` task, so RL starts
from a model that is sometimes right (as real RL starts from an SFT model). The warm-up answers
only ``sft_boxed_fraction`` of targets in ``\boxed{}`` form, so the reward (which needs the box)
has room to rise quickly under RL: the format is learned in a few rollouts, the sums more slowly.

Built once into the cache (``<cache>/models/<name>-<fingerprint>``), atomically.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from miles_core.data.tasks import BUILTIN_TASKS, format_answer
from miles_core.models.tokenizer import publish_model_dir, train_tokenizer

GENERAL_TEXT = [
    "The quick brown fox jumps over the lazy dog. It's 3.14, isn't it?",
    "Compute the answer and put it in \\boxed{}. Question: what is 2+2? Answer: \\boxed{4}",
    "Let x = 1/2 and y = 0.5; then x - y = 0.\n\nDone.",
]


@dataclass(frozen=True)
class TinySpec:
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 512
    task: str = "arith"
    sft_steps: int = 200
    sft_batch_size: int = 64
    sft_lr: float = 1e-3
    sft_boxed_fraction: float = 0.3  # the rest answer without \boxed{} (scores 0): RL has a format to learn
    seed: int = 0

    def fingerprint(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True) + "v1"
        return hashlib.sha256(blob.encode()).hexdigest()[:10]


BUILTIN_MODELS: dict[str, TinySpec] = {"tiny-qwen2": TinySpec(), "tiny-qwen2-base": TinySpec(sft_steps=0)}


def build_tiny(spec: TinySpec, out: Path) -> Path:
    """Tokenizer + random init + supervised warm-up, saved as an HF dir at ``out``."""
    rows = BUILTIN_TASKS[spec.task].rows()
    tok = train_tokenizer([r["input"] + format_answer(r["label"]) for r in rows] + GENERAL_TEXT, spec.vocab_size)
    model = init_model(spec, tok)
    if spec.sft_steps:
        sft_warmup(model, tok, rows, spec)
    return publish_model_dir(model, tok, out)


def init_model(spec: TinySpec, tok):
    """A randomly initialised Qwen2 of ``spec``'s sizes over the tokenizer ``tok`` (seeded)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(spec.seed)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads, max_position_embeddings=256, tie_word_embeddings=True,
        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        rope_theta=10000.0,
    )
    return Qwen2ForCausalLM(config)


def sft_warmup(model, tok, rows: list[dict], spec: TinySpec) -> None:
    """Teacher-forced cross-entropy on the response tokens (prompt and response tokenized apart,
    exactly as a rollout sees them)."""
    gen = torch.Generator().manual_seed(spec.seed)
    pick = torch.rand(len(rows), generator=gen) < spec.sft_boxed_fraction
    targets = [format_answer(r["label"]) if boxed else r["label"] for r, boxed in zip(rows, pick.tolist())]
    examples = []
    for r, t in zip(rows, targets):
        prompt, response = tok(r["input"])["input_ids"], tok(t)["input_ids"] + [tok.eos_token_id]
        examples.append((prompt + response, [0] * len(prompt) + [1] * len(response)))
    train_supervised(model, tok.pad_token_id, examples, spec, gen)


def train_supervised(model, pad_id: int, examples: list[tuple[list[int], list[int]]], spec: TinySpec, gen: torch.Generator) -> None:
    """AdamW on the cross-entropy of the tokens whose mask is 1; examples = (ids, mask) of equal lengths;
    ``sft_steps`` batches of ``sft_batch_size`` drawn with ``gen``, lr warmed up over 20 steps."""
    opt = torch.optim.AdamW(model.parameters(), lr=spec.sft_lr)
    model.train()
    for step in range(spec.sft_steps):
        idx = torch.randint(len(examples), (spec.sft_batch_size,), generator=gen)
        batch = [examples[i] for i in idx]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((len(batch), width), pad_id)  # [B, L]
        labels = torch.full((len(batch), width), -100)
        for i, (row, mask) in enumerate(batch):
            ids[i, : len(row)] = torch.tensor(row)
            labels[i, : len(row)] = torch.where(torch.tensor(mask, dtype=torch.bool), torch.tensor(row), -100)
        for g in opt.param_groups:
            g["lr"] = spec.sft_lr * min(1.0, (step + 1) / 20)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()

"""Tiny random causal LMs, hand-made samples and configs for the trainer tests (no files, no engine)."""

from __future__ import annotations

import random

import pytest
import torch

from miles_core.assemble import build_config
from miles_core.data.sample import Sample, Status

VOCAB = 48
PAD = 0


def tiny_lm(seed: int = 0, vocab: int = VOCAB):
    """A 2-layer Qwen2 causal LM with hidden size 32 (random init)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=True, pad_token_id=PAD,
        bos_token_id=1, eos_token_id=1,
    )
    return Qwen2ForCausalLM(config).eval()


def make_samples(n_groups: int = 2, group_size: int = 4, seed: int = 0, with_teacher: bool = False) -> list[Sample]:
    """Uneven prompt/response lengths; rewards 0/1 that differ inside each group."""
    rng = random.Random(seed)
    out = []
    for g in range(n_groups):
        prompt = [rng.randrange(2, VOCAB) for _ in range(rng.randint(2, 5))]
        for k in range(group_size):
            resp = [rng.randrange(2, VOCAB) for _ in range(rng.randint(1, 6))]
            out.append(Sample(
                group_index=g, index=g * group_size + k, tokens=prompt + resp, response_length=len(resp),
                loss_mask=[1] * len(resp), rollout_log_probs=[-rng.uniform(2.0, 5.0) for _ in resp],
                reward=float(k % 2), status=Status.COMPLETED, weight_versions=[1],
                teacher_log_probs=[-1.0] * len(resp) if with_teacher else None,
            ))
    return out


def make_cfg(**overrides):
    """A valid TrainConfig for 8 samples (2 prompts x 4), one optimizer step, micro-batches of 3."""
    values = {
        "hf_checkpoint": "unused", "prompt_data": "unused.jsonl", "rollout_batch_size": 2, "n_samples_per_prompt": 4,
        "num_steps_per_rollout": 1, "micro_batch_size": 3, "lr": 1e-3, "seed": 0,
    }
    return build_config({**values, **overrides})


@pytest.fixture
def samples():
    return make_samples()


@pytest.fixture
def lm():
    """tiny_lm as a fixture factory: lm(seed=0, vocab=VOCAB)."""
    return tiny_lm


@pytest.fixture
def cfg():
    """make_cfg as a fixture factory: cfg(**overrides)."""
    return make_cfg


@pytest.fixture
def sample_factory():
    return make_samples

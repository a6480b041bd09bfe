"""Tiny offline models and tokenizer for the checkpoint tests (nothing downloaded)."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

V = 256  # vocab


def tiny_config(tie: bool = True) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
    )


@pytest.fixture
def make_model():
    """make_model(seed=0, tie=True) -> a freshly initialised tiny Qwen2ForCausalLM (fp32, eval mode)."""

    def make(seed: int = 0, tie: bool = True) -> Qwen2ForCausalLM:
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(tiny_config(tie)).eval()

    return make


@pytest.fixture
def train_steps():
    """train_steps(model, optimizer, n): n AdamW steps on batches drawn from the torch RNG."""

    def run(model, optimizer, n: int) -> None:
        for _ in range(n):
            ids = torch.randint(0, V, (2, 8))  # [B, T], consumes RNG: resumed runs must match
            loss = model(input_ids=ids, labels=ids).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    return run


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on a few strings (vocab < V)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=240,
        special_tokens=["<unk>", "<pad>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["hello world", "the answer is 42", "2 + 2 = 4"] * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")

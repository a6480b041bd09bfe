"""Fixtures of the rollout tests: one real HFEngine on the builtin tiny model per test module."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def hf_engine(tiny_model_dir, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    from miles_core.rollout.hf_engine import HFEngine

    return HFEngine(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tiny_tokenizer)


@pytest.fixture
def engine(hf_engine):
    """The module's engine at weight version 0 (tests that move the version start from a known one)."""
    hf_engine.set_weight_version(0)
    return hf_engine


@pytest.fixture
def scripted_kind_rewards(monkeypatch):
    """Rewards by the prompt's metadata kind: ones -> 1.0, zeros -> 0.0, mixed -> 0/1 by sample parity
    (nonzero std), so which groups a filter drops is known exactly."""
    from miles_core.rollout import generate as generate_mod

    async def fake_rm(samples, opts):
        table = {"ones": lambda s: 1.0, "zeros": lambda s: 0.0, "mixed": lambda s: float(s.index % 2)}
        return [table[s.metadata["kind"]](s) for s in samples]

    monkeypatch.setattr(generate_mod, "batched_async_rm", fake_rm)

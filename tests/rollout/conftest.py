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

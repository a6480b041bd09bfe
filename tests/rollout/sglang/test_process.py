"""SGLangProcess: the subprocess wrapper of one engine, run against a stand-in `sglang.launch_server` that
serves our SGLang-protocol server (tests/rollout/sglang/standin), and against the real absence of SGLang."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flows.recipes import load_config
from miles_core.rollout.http import EngineHTTPError, HTTPEngineClient
from miles_core.rollout.sglang.launch import EngineLaunch, engine_client_options, new_api_key
from miles_core.rollout.sglang.process import SGLangProcess, free_port

ROOT = Path(__file__).resolve().parents[3]
STANDIN = Path(__file__).resolve().parent / "standin"
SGLANG = {"runtime": "ray", "rollout_engine": "sglang", "sglang_mem_fraction_static": 0.5}


def test_engine_starts_answers_with_its_key_and_dies_on_kill(tmp_path):
    cfg = load_config("tiny", SGLANG)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from miles_core.models.tokenizer import save_tokenizer, train_tokenizer

    tok = train_tokenizer(["hello world 1 2 3"] * 8, vocab_size=280)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, eos_token_id=tok.eos_token_id))
    model.save_pretrained(tmp_path / "m")
    save_tokenizer(tok, tmp_path / "m")
    key, argv_file = new_api_key(), tmp_path / "argv.json"
    spec = EngineLaunch(model_path=str(tmp_path / "m"), host="127.0.0.1", port=free_port(), api_key=key, engine_index=3)
    env = {"PYTHONPATH": os.pathsep.join([str(STANDIN), str(ROOT)]), "STANDIN_ARGV_FILE": str(argv_file)}
    with SGLangProcess.start(cfg, spec, tmp_path / "logs", env=env) as proc:
        proc.wait_ready(timeout_s=300, poll_s=0.2)
        assert proc.url == f"http://127.0.0.1:{spec.port}" and proc.alive()
        assert json.loads(argv_file.read_text())[-2:] == ["--mem-fraction-static", "0.5"]  # the passthrough reached it
        with HTTPEngineClient(proc.url, **engine_client_options(cfg, key)) as client:
            assert client.health() and client.get_weight_version() == 0
        with HTTPEngineClient(proc.url) as keyless, pytest.raises(EngineHTTPError) as e:
            keyless.get_weight_version()
        assert e.value.status == 401
        proc.kill()
        assert not proc.alive()


def test_an_engine_that_exits_fails_wait_ready_with_its_log(tmp_path):
    spec = EngineLaunch(model_path="/nowhere", host="127.0.0.1", port=free_port(), api_key="SECRET-KEY")
    proc = SGLangProcess.start(load_config("tiny", SGLANG), spec, tmp_path / "logs", env={"PYTHONPATH": ""})  # no sglang here
    with pytest.raises(RuntimeError, match="exited .* before it was ready") as e:
        proc.wait_ready(timeout_s=60, poll_s=0.1)
    assert "No module named 'sglang'" in str(e.value) and "SECRET-KEY" not in str(e.value)  # the key is masked


def test_an_sglang_engine_serving_the_adapter_launches_with_lora_and_takes_the_disk_sync(tmp_path):
    """lora_sync_from_tensor with rollout_engine sglang (update_weight_mode disk): the engine gets SGLang's LoRA arguments,
    the run's WeightSync writes the adapter dir and the engine loads it (/load_lora_adapter); generation through it
    (lora_path miles_lora) is, greedy, the merged model's."""
    import copy

    import torch
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from miles_core.models.tokenizer import save_tokenizer, train_tokenizer
    from miles_core.rollout.adapters import ThroughAdapter
    from miles_core.rollout.hf_engine import HFEngine
    from miles_core.rollout.http import EngineRouter
    from miles_core.rollout.http.options import weight_sync
    from miles_core.rollout.protocol import GenerateRequest, SamplingParams
    from miles_core.weights.sync import LORA_ADAPTER_NAME, WeightSender

    cfg = load_config("tiny", {**SGLANG, "lora_rank": 4, "lora_alpha": 8, "target_modules": "q_proj,v_proj",
                               "lora_sync_from_tensor": True, "update_weight_mode": "disk", "run_dir": str(tmp_path / "run")})
    tok = train_tokenizer(["hello world 1 2 3"] * 8, vocab_size=280)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, eos_token_id=tok.eos_token_id)).eval()
    model.save_pretrained(tmp_path / "m")
    save_tokenizer(tok, tmp_path / "m")
    adapted = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for n, p in adapted.named_parameters():
            if ".lora_B." in n:
                p.normal_(0.0, 0.5)
    config = adapted.peft_config["default"].to_dict()
    config["target_modules"] = sorted(config["target_modules"])
    sender = WeightSender(lambda: [], adapter=lambda: (config, sorted(get_peft_model_state_dict(adapted).items())))
    key, argv_file = new_api_key(), tmp_path / "argv.json"
    spec = EngineLaunch(model_path=str(tmp_path / "m"), host="127.0.0.1", port=free_port(), api_key=key)
    env = {"PYTHONPATH": os.pathsep.join([str(STANDIN), str(ROOT)]), "STANDIN_ARGV_FILE": str(argv_file)}
    with SGLangProcess.start(cfg, spec, tmp_path / "logs", env=env) as proc:
        proc.wait_ready(timeout_s=300, poll_s=0.2)
        argv = json.loads(argv_file.read_text())
        at = argv.index("--enable-lora")
        assert argv[at:at + 8] == ["--enable-lora", "--max-loras-per-batch", "1", "--max-lora-rank", "4",
                                   "--lora-target-modules", "q_proj", "v_proj"]
        sync = weight_sync(cfg, "gloo")
        with EngineRouter([HTTPEngineClient(proc.url, **engine_client_options(cfg, key))]) as router:
            sync.sync(sender, router, 1)
            requests = [GenerateRequest([5, 6, 7 + i], SamplingParams(max_new_tokens=8, top_k=1)) for i in range(3)]
            served = [r.output_ids for r in ThroughAdapter(router, LORA_ADAPTER_NAME).generate(requests, seed=0)]
            plain = [r.output_ids for r in router.generate(requests, seed=0)]
        sync.close()
    merged = HFEngine(copy.deepcopy(adapted).merge_and_unload(), tok, batching="exact")
    assert served == [r.output_ids for r in merged.generate(requests, seed=0)]
    assert served != plain  # the adapter is what changed the tokens
    assert [p.name for p in (tmp_path / "run" / "weight_sync").iterdir()] == ["lora-v1"]

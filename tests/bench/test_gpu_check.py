"""bench/gpu_check.py's CPU-testable core: the model it builds, the dry run, each part's own error, and its torch and
Megatron GRPO steps on CPU at the tiny shape (the same math: equal grad norms on equal weights)."""

from __future__ import annotations

import importlib.util
import json
import time

import pytest

from bench import gpu_check as g
from bench.flops import packed_train_flops, train_flops


def test_the_model_config_is_qwen2_0_5b():
    c = g.model_config("qwen2-0.5b")
    # Qwen/Qwen2-0.5B: 24 layers of hidden 896, 14 heads (head dim 64) over 2 KV heads, SwiGLU 4864, vocab 151936, tied
    assert (c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]) == (24, 896, 14, 2)
    assert (c["intermediate_size"], c["vocab_size"], c["tie_word_embeddings"], c["torch_dtype"]) == (4864, 151936, True, "bfloat16")
    with pytest.raises(ValueError, match="--shape 'qwen9': expected one of"):
        g.model_config("qwen9")


def test_build_model_dir_writes_an_hf_dir_of_that_config(tmp_path):
    from transformers import AutoModelForCausalLM

    path = g.build_model_dir("tiny", tmp_path / "m", dtype="float32")
    model = AutoModelForCausalLM.from_pretrained(path)
    want = g.model_config("tiny", "float32")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size", "intermediate_size"):
        assert getattr(model.config, key) == want[key], key
    # tied embeddings, 2 layers: embed 256x64 + per layer (q 64x64+64, k,v 64x32+32 each, o 64x64, mlp 3x64x128, 2 norms of 64) + final norm
    per_layer = (64 * 64 + 64) + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64
    assert sum(p.numel() for p in model.parameters()) == 256 * 64 + 2 * per_layer + 64


def test_dry_run_prints_the_sglang_command_and_builds_nothing(tmp_path, capsys):
    assert g.main(["--dry-run", "--skip", "torch", "--work-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "-m sglang.launch_server --model-path " + str(tmp_path / "model") in out
    assert "--skip-tokenizer-init" in out and "--api-key ***" in out and "torch: skipped" in out
    spec = "transformer_engine" if importlib.util.find_spec("transformer_engine") else "local"  # device cuda: TE if it imports
    assert f"megatron: MegatronTrainer with the {spec} layer spec in bfloat16" in out
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize(("argv", "message"), [(["--skip", "vllm"], "expected parts of"), (["--batch", "8x8"], "BxGxPxT")])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        g.parse_args(argv)
    assert message in capsys.readouterr().err


def test_a_failing_or_hung_part_is_a_figure_not_an_abort():
    assert g.run_part(lambda: {"x": 1.0}) == {"ok": True, "x": 1.0}
    failed = g.run_part(lambda: 1 / 0)
    assert failed["ok"] is False and failed["error"].startswith("ZeroDivisionError") and "1 / 0" in failed["traceback"]
    t0 = time.perf_counter()
    assert g.run_part(lambda: time.sleep(5), timeout_s=0.2) == {"ok": False, "error": "timed out after 0 s"}
    assert time.perf_counter() - t0 < 2


@pytest.mark.parametrize(("name", "tflops"), [
    ("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.5), ("NVIDIA H100 NVL", 835.5), ("NVIDIA H200", 989.4),
    ("NVIDIA B200", 2250.0), ("AMD Instinct MI300X", 1307.4), ("NVIDIA GeForce RTX 4090", None),
])
def test_the_peak_is_the_named_gpus(name, tflops):
    assert g.peak_for(name) == tflops


def test_cpu_run_writes_one_json_with_each_part(tmp_path, monkeypatch):
    """torch and megatron steps on CPU (tiny, fp32, same weights): equal grad norms; sglang reports its own state."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("MILES_BENCH_RESULTS", str(tmp_path / "results"))
    argv = ["--shape", "tiny", "--device", "cpu", "--dtype", "float32", "--batch", "2x2x8x8", "--micro-batch", "2",
            "--steps", "1", "--work-dir", str(tmp_path / "work"), "--sglang-timeout", "5"]
    assert g.main(argv) == 0
    data = json.loads((tmp_path / "results" / "gpu_check.json").read_text())
    f = data["figures"]
    torch_part, mega = f["torch"], f["megatron"]
    assert torch_part["ok"] and mega["ok"], (torch_part.get("error"), mega.get("error"))
    assert torch_part["device"] == mega["device"] == "cpu" and mega["layer_spec"] == "local"
    # distinct tokens: 2 prompts of 8 once, 4 responses of 8 (not 4 x (8 + 8): a group's prompt is one prompt)
    assert torch_part["tokens"] == mega["tokens"] == 2 * 8 + 4 * 8 and torch_part["step_s"] > 0 and mega["tokens_per_s"] > 0
    # the torch step's FLOPs are packed_train_flops of the model it trained, on-policy (no old-log-prob pass)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "work" / "model")
    assert torch_part["flops_per_step"] == packed_train_flops(model, [(8, [8, 8])] * 2, old_pass=False)
    assert mega["flops_per_step"] == train_flops(model, [16] * 4, old_pass=True)  # full sequences + the old-log-prob pass
    assert mega["restored"] and mega["sent_dtypes"] == ["float32"] and mega["optimizer"] == "AdamW"
    assert mega["grad_norm"] == pytest.approx(torch_part["grad_norm"], rel=1e-5)  # one GRPO step, two trainers
    if importlib.util.find_spec("sglang") is None:  # the default install: the part says why, the others ran
        assert f["sglang"]["ok"] is False and "pip install" in f["sglang"]["error"]
    assert "| torch | ok |" in (tmp_path / "results" / "gpu_check.md").read_text()


def test_the_logprob_check_after_a_sync_tells_arrived_weights_from_stale_ones(tmp_path):
    """The GPU check's per-mode verdict: an engine serving the sender's weights scores its own samples as the sender
    does (gap ~0); one still serving other weights does not (gap over the tolerance). The sender's weights are the launch
    weights scaled by SYNC_SCALE, as _one_sync scales them."""
    import torch
    from transformers import AutoModelForCausalLM

    from miles_core.rollout.hf_engine import HFEngine
    from miles_core.rollout.protocol import GenerateRequest, SamplingParams

    path = g.build_model_dir("tiny", tmp_path / "m", dtype="float32")
    sender = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        for p in sender.parameters():
            p.mul_(g.SYNC_SCALE)
    class Tok:  # what the engine reads of a tokenizer when no stop string is set
        eos_token_id, pad_token_id = 1, 0

    engine = HFEngine.from_pretrained(path, tokenizer=Tok(), batching="exact")
    probe = [GenerateRequest([3, 4, 5, 6], SamplingParams(max_new_tokens=4))] * 2
    assert g.logprob_gap(sender, engine, probe) > g.LOGPROB_TOL  # the engine has not got the sender's weights
    engine.model.load_state_dict(sender.state_dict())
    launched = AutoModelForCausalLM.from_pretrained(path)
    gap, control = g.logprob_gaps([sender, launched], engine, probe)  # one generate, scored by each model
    assert gap < 1e-4 and control > g.LOGPROB_TOL  # arrived, and told apart from the weights the engine launched with

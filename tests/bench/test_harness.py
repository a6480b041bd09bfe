"""The benchmark harness: statistics, the result files, the FLOP accounting, and one tiny step of each
side of the TRL comparison (the TRL pair needs the bench venv: `make bench-test`)."""

from __future__ import annotations

import json

import pytest
import torch

from bench.common import Result, paired_ratio, summarize, table
from bench.flops import forward_flops_per_token, matmul_params, train_flops
from bench.grpo_trl import Shape


def test_summarize_gives_median_quartiles_and_spread():
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["median"] == 3.0 and s["min"] == 1.0 and s["max"] == 100.0 and s["n"] == 5
    # statistics.quantiles (exclusive): p25 = 1.5, p75 = 52.0 -> IQR / median = 50.5 / 3
    assert s["p25"] == 1.5 and s["p75"] == 52.0 and s["rel_iqr"] == pytest.approx(50.5 / 3)


def test_paired_ratio_is_the_median_of_per_pair_ratios():
    # pairs: 2/1, 6/2, 4/4 -> ratios 2, 3, 1 -> median 2
    assert paired_ratio([2.0, 6.0, 4.0], [1.0, 2.0, 4.0])["median"] == 2.0


def test_shape_parses_and_caps_micro_batch():
    s = Shape.parse("16x8x128")
    assert (s.prompts, s.samples, s.new_tokens, s.n, s.micro_batch_size) == (16, 8, 128, 128, 32)
    assert Shape.parse("2x2x4").micro_batch_size == 4 and str(Shape.parse("8x4x32")) == "8x4x32"


def test_result_writes_json_and_markdown(tmp_path):
    r = Result("demo", {"k": 1}, figures={"x": 1.5}, ratios={"r": 2.0}, tables=[table(["a", "b"], [[1, 0.25]])], notes=["n"])
    path = r.write(tmp_path)
    data = json.loads(path.read_text())
    assert {"bench", "created_at", "machine", "versions", "config", "figures", "ratios", "noise", "notes"} <= set(data)
    assert data["machine"]["cpus"] >= 1 and "torch" in data["versions"] and len(data["machine"]["load_avg_end"]) == 3
    md = path.with_suffix(".md").read_text()
    assert md.startswith("# bench: demo") and "| 1 | 0.25 |" in md and "- n" in md


def test_flop_accounting_on_a_small_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    # per layer: q 16x16 + k 16x8 + v 16x8 + o 16x16 + gate/up/down 3 x 16x32 = 256+128+128+256+1536 = 2304;
    # 2 layers = 4608, + LM head 100x16 = 1600 (tied, still a matmul) -> 6208
    assert matmul_params(model) == 6208
    # forward per token at mean context 5: 2*6208 + 4 * 2 layers * 16 * 5 = 12416 + 640
    assert forward_flops_per_token(model, 5) == 12416 + 640
    # one sequence of 10 tokens (mean context 5), forward + backward = 3 forwards; + 1 with an old-log-prob pass
    assert train_flops(model, [10], old_pass=False) == 3 * 10 * (12416 + 640)
    assert train_flops(model, [10], old_pass=True) == 4 * 10 * (12416 + 640)


def test_decode_floor_bytes_on_a_small_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    from bench.bandwidth import decode_bytes

    cfg = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    # 6208 matmul weights (above) + K and V of 2 layers x 1 kv head x head_dim 8 per context position and row, fp32
    assert decode_bytes(model, batch=3, context=10) == 4 * (6208 + 2 * 2 * 1 * 8 * 10 * 3)
    assert decode_bytes(model.to(torch.bfloat16), batch=1, context=0) == 2 * 6208


def test_decode_floor_flops_on_a_small_llama():
    """A decode step's compute: each row multiplies every matmul weight (2 FLOPs each) and attends over the context
    (4 * layers * hidden per position): 3 rows at context 10 of the model above."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from bench.bandwidth import decode_flops

    cfg = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, tie_word_embeddings=True)
    assert decode_flops(LlamaForCausalLM(cfg), batch=3, context=10) == 3 * (2 * 6208 + 4 * 2 * 16 * 10)


def test_memory_bandwidth_result_has_each_kernel(tmp_path):
    from bench.bandwidth import bandwidth_result

    data = json.loads(bandwidth_result(mib=4, repeats=2).write(tmp_path).read_text())
    by = data["figures"]["by_kernel"]
    assert set(by) == {"sum", "gemv", "copy"} and all(v > 0 for v in by.values())
    assert data["figures"]["bytes_per_s"] == max(by.values()) and data["figures"]["buffer_bytes"] == 1024 * 1024 * 4


def test_miles_side_runs_one_step_through_the_library(tmp_path, monkeypatch, tiny_model_dir):
    import bench.common
    import bench.grpo_trl as g

    monkeypatch.setattr(g, "TMP", tmp_path)
    torch.manual_seed(0)
    side = g.MilesSide(Shape.parse("2x2x4"), seed=1, tag="t")
    side.step()
    t = side.trace
    assert len(t.seconds) == 1 and 0.0 <= t.reward[0] <= 1.0 and 1 <= t.completion_len[0] <= 4
    assert set(t.parts) == {"generate_reward", "engine", "train", "sync"} and t.parts["engine"][0] <= t.parts["generate_reward"][0]
    assert bench.common.TMP != tmp_path  # the patch is local to grpo_trl
    # the limits read the rollout's groups: 2 prompts x 2 samples
    (groups,) = [w["groups"] for w in side.work]
    assert len(groups) == 2 and all(len(r) == 2 for _, r in groups)
    limits = side.limits(0, peak=1e12, bandwidth=1e12)
    assert 0 < limits["trainer_mfu"]["median"] < 1 and limits["engine_over_floor"]["median"] > 1
    assert limits["old_policy_pass"] is False  # on-policy: the tiny recipe's step replays the old-policy pass


def test_the_engine_floor_prefills_each_prompt_once_and_decodes_the_rows_still_generating():
    from transformers import LlamaConfig, LlamaForCausalLM

    from bench.bandwidth import decode_bytes, decode_flops
    from bench.flops import packed_train_flops
    from bench.grpo_trl import engine_floor_s

    model = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1))
    peak, bw = 1e6, 1e6
    # a 4-token prompt shared by responses of 2 and 1 tokens: step 0 decodes 2 rows at context 4, step 1 one at 5
    prefill = packed_train_flops(model, [(4, [])], False) / 3 / peak
    steps = [max(decode_bytes(model, b, c) / bw, decode_flops(model, b, c) / peak) for b, c in ((2, 4), (1, 5))]
    assert engine_floor_s(model, [(4, [2, 1])], peak, bw) == pytest.approx(prefill + sum(steps))
    # two groups of the same shape cost twice; the bandwidth-bound step (weights read once) is shared by its rows
    two = engine_floor_s(model, [(4, [2, 1]), (4, [2, 1])], peak, bw)
    assert two == pytest.approx(2 * prefill + sum(max(decode_bytes(model, 2 * b, c) / bw, decode_flops(model, 2 * b, c) / peak)
                                                  for b, c in ((2, 4), (1, 5))))


@pytest.mark.bench_venv  # TRL is in .venv-bench only: `make bench-test`
def test_trl_and_miles_alternate_in_one_invocation(tmp_path, monkeypatch, tiny_model_dir):
    import bench.grpo_trl as g

    monkeypatch.setattr(g, "TMP", tmp_path)
    miles, trl, settings, limits = g.run_pair(Shape.parse("2x2x4"), steps=2, warmup=0, seed=1)
    assert limits["trainer_mfu"]["median"] > 0 and len(limits["peak_and_bandwidth_before_after"]) == 2
    assert len(miles.seconds) == len(trl.seconds) == 2 and len(trl.reward) == 2 and len(miles.reward) == 2
    assert settings["micro_batch_size"] == 4 and trl.parts["generate_reward"] and trl.parts["train"]


def test_packed_flop_accounting_counts_a_shared_prompt_once_and_the_head_at_responses_only():
    from transformers import LlamaConfig, LlamaForCausalLM

    from bench.flops import packed_train_flops

    cfg = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    body, head, attn = 2 * 4608, 2 * 1600, 4 * 2 * 16  # see the test above
    # one group: a 4-token prompt (mean context 2), two responses of 2 tokens (mean context 4 + 1 = 5)
    expected = 4 * (body + attn * 2) + 2 * 2 * (body + head + attn * 5)
    assert packed_train_flops(model, [(4, [2, 2])], old_pass=False) == 3 * expected
    assert packed_train_flops(model, [(4, [2, 2])], old_pass=True) == 4 * expected


def test_chat_prompts_are_messages_and_a_conversational_completion_is_scored_by_its_last_message():
    """--chat: TRL gets each arith prompt as one user message (it applies the chat template, as miles'
    apply_chat_template does), and its completions come back as messages: the reward scores the assistant's text."""
    from bench.grpo_trl import arith_rows, math_reward

    plain, chat = arith_rows(2), arith_rows(2, chat=True)
    assert [r["label"] for r in plain] == [r["label"] for r in chat]
    assert [r["prompt"] for r in chat] == [[{"role": "user", "content": r["prompt"]}] for r in plain]
    label = plain[0]["label"]
    right, wrong = f"The answer is \\boxed{{{label}}}.", "The answer is \\boxed{-12345}."
    assert math_reward([right, wrong], [label, label]) == [1.0, 0.0]
    assert math_reward([[{"role": "assistant", "content": right}], [{"role": "assistant", "content": wrong}]],
                       [label, label]) == [1.0, 0.0]

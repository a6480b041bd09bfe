"""The SGLang wire format: request and response mapping, seeds, weight buckets."""

from __future__ import annotations

import pytest
import torch

from miles_core.rollout.http import wire
from miles_core.rollout.protocol import GenerateRequest, GenerateResult, SamplingParams


def test_request_body_round_trips_through_the_server_parser():
    reqs = [GenerateRequest([1, 2], SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=5, stop_token_ids=(3,), stop=("\n\n",))), GenerateRequest([4], SamplingParams())]
    body = wire.generate_body(reqs, [11, 12])
    assert body["sampling_params"][0] == {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_new_tokens": 5,
                                          "stop": ["\n\n"], "stop_token_ids": [3], "sampling_seed": 11,
                                          "skip_special_tokens": True}
    parsed, seeds, batched, top = wire.parse_generate(body, vocab_size=10)
    assert parsed == reqs and seeds == [11, 12] and batched and top is None


def test_min_new_tokens_is_sent_when_set_and_checked_as_sglang_does():
    """SGLang's sampling param (SamplingParams.min_new_tokens, 0.5.23 sampling_params.py:164; verify(): 0 <= min <= max)."""
    req = GenerateRequest([1, 2], SamplingParams(max_new_tokens=5, min_new_tokens=3))
    body = wire.generate_body([req], [1])
    assert body["sampling_params"][0]["min_new_tokens"] == 3
    assert wire.parse_generate(body, vocab_size=10)[0] == [req]
    assert "min_new_tokens" not in wire.generate_body([GenerateRequest([1], SamplingParams())], [1])["sampling_params"][0]
    with pytest.raises(wire.WireError, match=r"min_new_tokens must be in \[0, max_new_tokens\(5\)\], got 6"):
        wire.params_from_json({"max_new_tokens": 5, "min_new_tokens": 6})


def test_single_request_shared_params_and_sglang_extras():
    body = {"input_ids": [1, 2], "sampling_params": {"stop": "x", "skip_special_tokens": False, "n": 1}, "seed": 3}
    [req], seeds, batched, top = wire.parse_generate(body, vocab_size=10)
    assert req.params.stop == ("x",) and req.params.max_new_tokens == 128 and seeds == [None]
    assert req.params.skip_special_tokens is False  # SGLang's default True when absent: the text only
    assert not batched and top == 3


def test_parses_an_sglang_style_response():
    # what SGLang returns: logprob entries carry (logprob, id, text-or-null); the matched stop
    # token may be trimmed from output_ids; weight_version may be missing (older servers)
    d = {"text": "hi", "output_ids": [7], "meta_info": {
        "finish_reason": {"type": "stop", "matched": 2}, "prompt_tokens": 3,
        "output_token_logprobs": [[-0.5, 7, "hi"], [-0.25, 2, None]]}}
    res = wire.result_from_json(d, prompt_len=3, default_version=4)
    assert (res.output_ids, res.output_log_probs, res.finish_reason, res.weight_version) == ([7, 2], [-0.5, -0.25], "stop", 4)
    d["meta_info"]["weight_version"] = "default"
    assert wire.result_from_json(d, 3).weight_version == 0
    with pytest.raises(wire.WireError, match="finish_reason"):
        wire.result_from_json({"meta_info": {"output_token_logprobs": [], "finish_reason": {"type": "eos"}}}, 1)
    with pytest.raises(wire.WireError, match="return_logprob"):
        wire.result_from_json({"meta_info": {"finish_reason": {"type": "stop"}}}, 1)


def test_result_json_round_trip():
    res = GenerateResult([5, 6], [-1.0, -2.0], "length", 3, prompt_tokens=4)
    d = wire.result_to_json(res, "ab", "rid", 0.1, return_logprob=True)
    assert d["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
    back = wire.result_from_json(d, 4)
    assert (back.output_ids, back.output_log_probs, back.finish_reason, back.weight_version, back.prompt_tokens) == ([5, 6], [-1.0, -2.0], "length", 3, 4)


def test_buckets_round_trip_with_tied_tensors():
    emb = torch.randn(4, 3)
    named = [("embed.weight", emb), ("lm_head.weight", emb), ("norm", torch.ones(3, dtype=torch.bfloat16))]
    back = wire.decode_bucket(wire.encode_bucket(named))
    assert sorted(back) == ["embed.weight", "lm_head.weight", "norm"]
    assert torch.equal(back["lm_head.weight"], emb) and back["norm"].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="twice"):
        wire.encode_bucket([("a", emb), ("a", emb)])
    with pytest.raises(wire.WireError):
        wire.decode_bucket(b"\x00" * 12)


def test_versions():
    assert wire.parse_version("7") == 7 and wire.parse_version(7) == 7 and wire.parse_version("default") == 0
    with pytest.raises(wire.WireError, match="not an integer"):
        wire.parse_version("v1")


def test_response_text_trims_the_stop_that_ended_it_and_follows_skip_special_tokens(tiny_tokenizer):
    """SGLang's text: the final stop token trimmed (detokenizer trim_matched_stop), special tokens kept unless
    skip_special_tokens; rollout_skip_special_tokens (default off, the reference's) reaches the rollout's params."""
    from miles_core.config import build_config
    from miles_core.rollout.protocol import SamplingParams
    from miles_core.specs import sampling_params

    tok = tiny_tokenizer
    eos, word = tok.eos_token_id, tok("hello", add_special_tokens=False)["input_ids"]
    ids = word + [eos] + word + [eos]  # a special token inside the response, and the EOS that ended it
    keep = wire.response_text(tok, ids, SamplingParams(stop_token_ids=(eos,), skip_special_tokens=False))
    skip = wire.response_text(tok, ids, SamplingParams(stop_token_ids=(eos,), skip_special_tokens=True))
    assert keep == tok.decode(ids[:-1], skip_special_tokens=False) and keep.count(tok.eos_token) == 1
    assert skip == tok.decode(ids, skip_special_tokens=True) and tok.eos_token not in skip
    assert wire.response_text(tok, word, SamplingParams(skip_special_tokens=False)) == tok.decode(word)  # no stop: kept whole
    base = {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "prompt_data": "builtin://arith"}
    assert sampling_params(build_config(base), eos).skip_special_tokens is False
    assert sampling_params(build_config({**base, "rollout_skip_special_tokens": True}), eos).skip_special_tokens is True
    from miles_core.rollout.sglang.protocol import protocol  # sent as SGLang 0.5.23's SamplingParams.skip_special_tokens

    sent = wire.params_to_json(SamplingParams(skip_special_tokens=False), None)
    assert sent["skip_special_tokens"] is False and "skip_special_tokens" in protocol()["requests"]["SamplingParams"]

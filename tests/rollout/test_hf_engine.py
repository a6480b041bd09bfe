"""HF engine: reproducible sampling, log-probs from raw logits / temperature, finish reasons, weights."""

from __future__ import annotations

import pytest
import torch

from miles_core.rollout.hf_engine import HFEngine, filter_logits
from miles_core.rollout.protocol import GenerateRequest, SamplingParams
from miles_core.training.batch import make_batch, response_log_probs
from miles_core.data.sample import Sample


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    return HFEngine(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tiny_tokenizer)


def _reqs(tok, prompts, **kw):
    params = SamplingParams(stop_token_ids=(tok.eos_token_id,), **kw)
    return [GenerateRequest(tok(p)["input_ids"], params) for p in prompts]


PROMPTS = ["1+2=", "13-4=", "7+7=", "9-9="]


def test_same_seed_same_tokens_other_seed_differs(engine, tiny_tokenizer):
    reqs = _reqs(tiny_tokenizer, PROMPTS * 4, temperature=1.0, max_new_tokens=10)
    a, b, c = engine.generate(reqs, seed=1), engine.generate(reqs, seed=1), engine.generate(reqs, seed=2)
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    assert [r.output_ids for r in a] != [r.output_ids for r in c]


def test_logprobs_match_trainer_recompute(engine, tiny_tokenizer):
    """Left-padded KV-cache decoding vs right-padded full forward: same numbers (fp32)."""
    temperature = 0.7
    reqs = _reqs(tiny_tokenizer, ["1+2=", "13-4=", "7+7="], temperature=temperature, top_k=5, top_p=0.9, max_new_tokens=8)
    results = engine.generate(reqs, seed=3)
    samples = [
        Sample(tokens=r.input_ids + res.output_ids, response_length=len(res.output_ids), loss_mask=[1] * len(res.output_ids),
               rollout_log_probs=res.output_log_probs)
        for r, res in zip(reqs, results)
    ]
    batch = make_batch(samples, tiny_tokenizer.pad_token_id)
    with torch.no_grad():
        lp, _ = response_log_probs(engine.model, batch, temperature, with_entropy=False)
    diff = ((lp - batch.rollout_log_probs).abs() * batch.loss_mask).max()
    assert diff < 1e-5, diff
    # and they are the raw-logit log-probs, not the top-k/top-p renormalised ones (those would be >= raw)
    assert (batch.rollout_log_probs * batch.loss_mask).sum() < 0


def test_finish_reasons_and_max_new_tokens(engine, tiny_tokenizer):
    res = engine.generate(_reqs(tiny_tokenizer, PROMPTS, max_new_tokens=2), seed=0)
    assert all(r.finish_reason in ("length", "stop") and len(r.output_ids) <= 2 for r in res)
    assert any(r.finish_reason == "length" for r in res)
    res = engine.generate(_reqs(tiny_tokenizer, PROMPTS, max_new_tokens=30), seed=0)
    stopped = [r for r in res if r.finish_reason == "stop"]
    assert stopped and all(r.output_ids[-1] == tiny_tokenizer.eos_token_id for r in stopped)


def test_stop_string(engine, tiny_tokenizer):
    res = engine.generate(_reqs(tiny_tokenizer, PROMPTS, max_new_tokens=12, stop=("{",)), seed=0)
    for r in res:
        text = tiny_tokenizer.decode(r.output_ids, skip_special_tokens=True)
        if r.finish_reason == "stop" and r.output_ids[-1] != tiny_tokenizer.eos_token_id:
            assert text.endswith("{")


def test_filter_logits_topk_topp():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0]])
    assert torch.isinf(filter_logits(logits, 2, 1.0)[0, 2:]).all()
    out = filter_logits(logits, -1, 0.5)  # p = [.64, .24, ...]: the first token alone reaches 0.5
    assert torch.isfinite(out[0, 0]) and torch.isinf(out[0, 1:]).all()


def test_weight_update_and_version(tiny_model_dir, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    eng = HFEngine(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tiny_tokenizer)
    reqs = _reqs(tiny_tokenizer, PROMPTS, max_new_tokens=6)
    before = eng.generate(reqs, seed=5)
    zeros = [(k, torch.zeros_like(v)) for k, v in eng.model.state_dict().items() if k.endswith("mlp.down_proj.weight")]
    eng.update_weights_from_tensor(zeros)
    eng.set_weight_version(7)
    after = eng.generate(reqs, seed=5)
    assert all(r.weight_version == 7 for r in after)
    assert [r.output_log_probs for r in after] != [r.output_log_probs for r in before]
    with pytest.raises(KeyError, match="no parameter"):
        eng.update_weights_from_tensor([("nope.weight", torch.zeros(1))])

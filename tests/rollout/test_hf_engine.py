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


def test_min_new_tokens_masks_the_stop_ids_until_reached(engine, tiny_tokenizer):
    """SGLang's min_new_tokens (penaltylib/min_new_tokens.py: -inf on EOS and stop_token_ids while the output is
    shorter): rows that stop early without it run to at least the minimum with it, the rest of the batch too."""
    free = engine.generate(_reqs(tiny_tokenizer, PROMPTS * 2, max_new_tokens=30), seed=0)
    early = [len(r.output_ids) for r in free if r.finish_reason == "stop"]
    assert early and min(early) < 8  # the tiny model stops early on its own: the check below could fail
    res = engine.generate(_reqs(tiny_tokenizer, PROMPTS * 2, max_new_tokens=30, min_new_tokens=8), seed=0)
    for r in res:
        assert len(r.output_ids) >= 8 and tiny_tokenizer.eos_token_id not in r.output_ids[:7], r
    # the mask shapes sampling only: the log-probs stay those of the raw logits (the trainer's), so some
    # masked-out stop id still had probability mass at the steps before the minimum
    assert all(lp <= 0 for r in res for lp in r.output_log_probs)


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
    eng.begin_weight_update()
    eng.update_weights_from_tensor(zeros)
    eng.set_weight_version(7)
    after = eng.generate(reqs, seed=5)
    assert all(r.weight_version == 7 for r in after)
    assert [r.output_log_probs for r in after] != [r.output_log_probs for r in before]
    with pytest.raises(KeyError, match="no parameter"):
        eng.update_weights_from_tensor([("nope.weight", torch.zeros(1))])


# ---- the speed-ups are exact: each against the plain path, same seeds ------------------------
def _variant(engine, **kw):
    return HFEngine(engine.model, engine.tokenizer, **kw)


def _assert_close(a, b, tol=1e-5):
    """Same token ids and finish reasons; log-probs within tol (float32 GEMMs round with the batch shape)."""
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    assert [r.finish_reason for r in a] == [r.finish_reason for r in b]
    worst = max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra.output_log_probs, rb.output_log_probs))
    assert worst < tol, worst


def _groups(tok, G=4, **kw):
    """B=4 prompts x G samples, group members adjacent (as the generate loop sends them)."""
    return _reqs(tok, [p for p in PROMPTS for _ in range(G)], **kw)


def test_shared_prefill_equals_one_prefill_per_request(engine, tiny_tokenizer):
    reqs = _groups(tiny_tokenizer, temperature=1.0, max_new_tokens=12)
    shared = _variant(engine, share_prefill=True).generate(reqs, seed=11)
    plain = _variant(engine, share_prefill=False).generate(reqs, seed=11)
    _assert_close(shared, plain)
    assert len({tuple(r.output_ids) for r in shared[:4]}) > 1  # the G samples of a group still differ


def test_dropping_finished_rows_equals_full_batch_decoding(engine, tiny_tokenizer):
    reqs = _groups(tiny_tokenizer, temperature=1.0, max_new_tokens=24)
    dropped = _variant(engine, drop_finished=True).generate(reqs, seed=4)
    full = _variant(engine, drop_finished=False, share_prefill=False).generate(reqs, seed=4)
    lengths = {len(r.output_ids) for r in dropped}
    assert len(lengths) > 1, lengths  # rows did finish at different steps, so rows were dropped
    _assert_close(dropped, full)


def test_result_does_not_depend_on_batch_composition(engine, tiny_tokenizer):
    """The seeding contract: request i's sample depends on its own seed only (request_seed(seed, i))."""
    from miles_core.rollout.hf_engine import request_seed

    reqs = _groups(tiny_tokenizer, temperature=1.0, max_new_tokens=10)
    seeds = [request_seed(9, i) for i in range(len(reqs))]
    together = engine.generate_seeded(reqs, seeds)
    order = [13, 2, 7]
    subset = engine.generate_seeded([reqs[i] for i in order], [seeds[i] for i in order])
    alone = _variant(engine, batching="exact").generate_seeded(reqs, seeds)
    _assert_close(subset, [together[i] for i in order])
    _assert_close(together, alone)
    assert [r.output_ids for r in engine.generate(reqs, seed=9)] == [r.output_ids for r in together]


def test_mixed_sampling_params_in_one_batch_each_get_their_own_filter(engine, tiny_tokenizer):
    tok = tiny_tokenizer
    mk = lambda p, **kw: GenerateRequest(tok(p)["input_ids"], SamplingParams(stop_token_ids=(tok.eos_token_id,), max_new_tokens=8, **kw))  # noqa: E731
    reqs = [mk("1+2=", temperature=1.0), mk("13-4=", temperature=1.0, top_k=1), mk("7+7=", temperature=0.7, top_p=0.3),
            mk("9-9=", temperature=1.0, top_k=3, top_p=0.8), mk("1+2=", temperature=1.0, top_k=1)]
    mixed = engine.generate(reqs, seed=21)
    alone = _variant(engine, batching="exact").generate(reqs, seed=21)
    _assert_close(mixed, alone)
    # top_k=1 is greedy whatever the batch: the argmax of the logits at each step
    for r, res in zip((reqs[1], reqs[4]), (mixed[1], mixed[4])):
        ids = list(r.input_ids)
        for t in res.output_ids:
            with torch.no_grad():
                assert t == int(engine.model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(t)


def test_filter_logits_per_row_equals_filter_logits_per_request():
    torch.manual_seed(0)
    logits = torch.randn(5, 50)
    ks, ps = [-1, 1, 5, 50, 3], [1.0, 1.0, 0.5, 0.9, 0.2]
    rows = filter_logits(logits, ks, ps)
    for i, (k, p) in enumerate(zip(ks, ps)):
        assert torch.equal(rows[i], filter_logits(logits[i : i + 1], k, p)[0])
    assert torch.isfinite(rows[1]).sum() == 1 and torch.isfinite(rows[0]).all() and torch.isfinite(rows[2]).sum() <= 5


def test_lean_decode_equals_the_transformers_forward(engine, tiny_tokenizer):
    assert engine.lean_decode  # tiny Qwen2: the lean path is the default
    reqs = _groups(tiny_tokenizer, temperature=0.8, top_k=20, max_new_tokens=16)
    for kw in ({}, {"drop_finished": False}):
        lean = _variant(engine, **kw).generate(reqs, seed=6)
        hf = _variant(engine, lean_decode=False, **kw).generate(reqs, seed=6)
        _assert_close(lean, hf)

"""HFEngine as the server runs it (HFEngine.from_pretrained): per-request seeds, batching policies, abort polling."""

from __future__ import annotations

from collections import Counter

import torch

from miles_core.rollout.http.engine import request_seed
from miles_core.rollout.protocol import GenerateRequest, SamplingParams

from http_helpers import requests_for, same_results


def test_request_seed_is_stable_and_spread():
    # blake2b("0:0"), 8 bytes big-endian, mod 2^62: a pinned value, so seeds never change silently
    assert request_seed(0, 0) == request_seed(0, 0) == 1543780838996037730
    seeds = {request_seed(s, i) for s in range(20) for i in range(50)}
    assert len(seeds) == 1000 and all(0 <= x < 2**62 for x in seeds)


def test_sampler_follows_the_filtered_distribution(make_engine):
    engine = make_engine("dynamic")
    prompt, n, temperature = [5, 6, 7], 4000, 0.02  # low temperature: top-5 probabilities 0.29 .. 0.15
    out = engine.generate([GenerateRequest(prompt, SamplingParams(temperature=temperature, top_k=5, max_new_tokens=1))] * n, seed=0)
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([prompt])).logits[0, -1].float() / temperature  # [V]
    top = torch.topk(logits, 5)
    counts = Counter(r.output_ids[0] for r in out)
    assert set(counts) <= set(top.indices.tolist())  # never outside the top-k
    expected = torch.softmax(top.values, -1)
    observed = torch.tensor([counts[t] / n for t in top.indices.tolist()])
    assert (observed - expected).abs().sum() / 2 < 0.04  # total variation (seed 0: 0.009)
    logp = torch.log_softmax(logits, -1)  # log-probs: of the full tempered distribution, not the filtered one
    assert all(abs(r.output_log_probs[0] - float(logp[r.output_ids[0]])) < 1e-5 for r in out[:50])


def test_exact_results_do_not_depend_on_the_batch(make_engine):
    engine = make_engine("exact")
    reqs = requests_for(6)
    seeds = [request_seed(3, i) for i in range(6)]
    full = engine.generate_seeded(reqs, seeds)
    order = [4, 1, 5, 0]
    part = engine.generate_seeded([reqs[i] for i in order], [seeds[i] for i in order])
    assert same_results(part, [full[i] for i in order])


def test_dynamic_batches_in_chunks_and_stays_close_to_exact(make_engine):
    engine = make_engine("dynamic", max_batch_size=2)
    reqs = requests_for(4) + requests_for(2, temperature=0.5)
    assert engine.plan_batches(reqs) == [[0, 1], [2, 3], [4, 5]]  # in order; sampling params may differ within a batch
    exact = make_engine("exact").generate(reqs, seed=5)
    dynamic = engine.generate(reqs, seed=5)
    # float32 GEMMs round differently with the batch shape: same tokens, log-probs within ~1e-5
    for a, b in zip(exact, dynamic):
        assert a.output_ids == b.output_ids
        assert max(abs(x - y) for x, y in zip(a.output_log_probs, b.output_log_probs)) < 1e-4


def test_aborted_rows_stop_with_what_they_have(make_engine):
    engine = make_engine("dynamic")
    reqs = requests_for(3, max_new_tokens=50)
    steps = {"n": 0}

    def aborted(i: int) -> bool:  # row 1 is aborted after 5 decode steps
        steps["n"] += i == 0
        return i == 1 and steps["n"] > 5

    out = engine.generate_seeded(reqs, [1, 2, 3], aborted)
    assert [r.finish_reason for r in out] == ["length", "abort", "length"]
    assert len(out[1].output_ids) == len(out[1].output_log_probs) == 5 and len(out[0].output_ids) == 50

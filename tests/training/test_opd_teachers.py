"""OPD teachers behind SGLang's /generate (opd_teacher_urls, opd_teacher_key) and top-k OPD (opd_log_prob_top_k,
opd_top_k_strategy, opd_reward_weight_mode) through the trainer: real torch, teachers served by miles' HTTP server
on 127.0.0.1 (one per teacher name)."""

from __future__ import annotations

import math

import httpx
import pytest
import torch

from miles_core.rollout.http import HFEngine, serve_in_thread
from miles_core.training.batch import make_batch, response_log_probs, response_logits
from miles_core.training.teacher import HttpTeacher, ModelTeacher, TopK
from miles_core.training.torch_trainer import TorchTrainer

PAD = 0


@pytest.fixture
def teachers(lm, tiny_tokenizer):
    """{name: (teacher model, server handle)} for two random teachers, each on its own server."""
    out = {}
    for name, seed in (("math", 7), ("code", 11)):
        model = lm(seed=seed)
        out[name] = (model, serve_in_thread(HFEngine(model, tiny_tokenizer, batching="exact")))
    yield out
    for _, handle in out.values():
        handle.stop()


def routed(samples, names):
    for s, name in zip(samples, names):
        s.metadata = {"opd_teacher": name}
    return samples


def test_the_server_answers_prefill_only_requests_in_sglangs_shape(teachers):
    model, handle = teachers["math"]
    ids = [5, 9, 3, 7, 2]
    body = {"input_ids": ids, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 3,
            "token_ids_logprob": [4, 9], "sampling_params": {"temperature": 0, "max_new_tokens": 0}}
    meta = httpx.post(handle.url + "/generate", json=body).json()["meta_info"]
    logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)  # raw logits, as SGLang
    assert meta["output_token_logprobs"] == [] and meta["completion_tokens"] == 0
    assert meta["input_token_logprobs"][0] == [None, 5, None]  # token 0: SGLang's placeholder
    assert meta["input_top_logprobs"][0] is None and meta["input_token_ids_logprobs"][0] is None
    for j in range(1, len(ids)):
        lp, tok, text = meta["input_token_logprobs"][j]
        assert (tok, text) == (ids[j], None) and lp == pytest.approx(float(logp[j - 1, ids[j]]), abs=1e-5)
        top = meta["input_top_logprobs"][j]
        vals, idx = logp[j - 1].topk(3)
        assert [e[1] for e in top] == idx.tolist() and [e[0] for e in top] == pytest.approx(vals.tolist(), abs=1e-5)
        assert [[e[1], round(e[0], 5)] for e in meta["input_token_ids_logprobs"][j]] == \
            [[t, round(float(logp[j - 1, t]), 5)] for t in (4, 9)]
    # top log-probs of generated tokens are not served: refused, never answered without them
    gen = {"input_ids": ids, "return_logprob": True, "top_logprobs_num": 3, "sampling_params": {"max_new_tokens": 2}}
    r = httpx.post(handle.url + "/generate", json=gen)
    assert r.status_code == 400 and "prefill-only" in r.text


def test_each_sample_goes_to_the_teacher_its_key_names(teachers, sample_factory):
    samples = routed(sample_factory(), ["math", "code"] * 4)
    urls = {name: h.url + "/generate" for name, (_, h) in teachers.items()}
    teacher = HttpTeacher(urls, "opd_teacher")
    batch = make_batch(samples, PAD)
    got = teacher.log_probs(batch, samples)  # [N, T]
    m = batch.loss_mask
    for name, (model, handle) in teachers.items():
        rows = [i for i, s in enumerate(samples) if s.metadata["opd_teacher"] == name]
        direct, _ = response_log_probs(model, batch, 1.0, with_entropy=False)
        torch.testing.assert_close(got[rows] * m[rows], direct[rows] * m[rows], atol=1e-5, rtol=1e-5)
        assert handle.server.stats["generate_calls"] == len(rows)  # one prefill-only request per sample, to its teacher


def test_the_trainer_scores_with_the_teachers_of_opd_teacher_urls(teachers, lm, cfg, sample_factory):
    urls = [f"{name}={h.url}/generate" for name, (_, h) in teachers.items()]
    c = cfg(use_opd=True, opd_type="sglang", opd_teacher_urls=urls, opd_teacher_key="domain")
    samples = sample_factory()
    for s, name in zip(samples, ["code", "math"] * 4):
        s.metadata = {"domain": name}
    batch = make_batch(samples, PAD)
    tensors = TorchTrainer(lm(), c, pad_id=PAD).forward_passes(batch, samples)
    m = batch.loss_mask
    for name, (model, _) in teachers.items():
        rows = [i for i, s in enumerate(samples) if s.metadata["domain"] == name]
        direct, _ = response_log_probs(model, batch, 1.0, with_entropy=False)
        torch.testing.assert_close(tensors.teacher[rows] * m[rows], direct[rows] * m[rows], atol=1e-5, rtol=1e-5)


def test_a_bad_teacher_name_fails_naming_the_key(teachers, sample_factory):
    urls = {name: h.url + "/generate" for name, (_, h) in teachers.items()}
    samples = routed(sample_factory(), ["math"] * 7 + ["poetry"])
    batch = make_batch(samples, PAD)
    with pytest.raises(ValueError, match=r"sample 7 .*metadata\['opd_teacher'\] = 'poetry' names no teacher"):
        HttpTeacher(urls, "opd_teacher").log_probs(batch, samples)
    # with a default teacher the unknown name falls back to it, as the reference's reserved name
    fallback = HttpTeacher({**urls, "default": urls["code"]}, "opd_teacher")
    assert fallback.url_for(samples[7]) == urls["code"] and fallback.url_for(samples[0]) == urls["math"]
    other_key = routed(sample_factory(), ["math"] * 8)
    with pytest.raises(ValueError, match=r"metadata has no 'domain'"):
        HttpTeacher(urls, "domain").url_for(other_key[0])


@pytest.mark.parametrize("strategy", ["only-student", "only-teacher", "intersection", "union", "xor"])
def test_the_http_teacher_gives_the_in_process_top_k_estimate(teachers, lm, sample_factory, strategy):
    model, handle = teachers["math"]
    samples = routed(sample_factory(), ["math"] * 8)
    batch = make_batch(samples, PAD)
    student = torch.log_softmax(response_logits(lm(), batch).float(), -1)  # [N, T, V] at temperature 1
    topk = TopK(k=4, strategy=strategy, mode="teacher_p")
    by_http = HttpTeacher({"math": handle.url + "/generate"}, "opd_teacher").topk_kl(student, batch, samples, topk)
    in_process = ModelTeacher(model, 1.0, 3).topk_kl(student, batch, samples, topk)
    m = batch.loss_mask
    torch.testing.assert_close(by_http * m, in_process * m, atol=1e-4, rtol=1e-4)
    assert float((in_process * m).abs().sum()) > 0.01


def _formula(s: list[float], t: list[float], k: int, strategy: str, mode: str) -> float:
    """Top-k OPD at one position, written from the formula (docs/advanced/opd.md)."""
    top = lambda lp: set(sorted(range(len(lp)), key=lambda i: -lp[i])[:k])  # noqa: E731
    S, T = top(s), top(t)
    chosen = {"only-student": S, "only-teacher": T, "intersection": S & T, "union": S | T, "xor": S ^ T}[strategy]
    w = {i: math.exp({"student_p": s[i], "teacher_p": t[i], "none": 0.0}[mode]) for i in chosen}
    z = 1.0 if strategy == "xor" else sum(w.values())
    return sum(w[i] / z * (s[i] - t[i]) for i in chosen)


@pytest.mark.parametrize("strategy,mode", [("only-student", "student_p"), ("xor", "teacher_p")])
def test_trainer_top_k_opd_advantages(lm, cfg, sample_factory, strategy, mode):
    c = cfg(use_opd=True, opd_teacher_load="unused", opd_kl_coef=0.5, opd_log_prob_top_k=3, opd_top_k_strategy=strategy,
            opd_reward_weight_mode=mode, rollout_temperature=0.8)
    samples = sample_factory()
    policy, teacher_model = lm(), lm(seed=7)
    batch = make_batch(samples, PAD)
    with torch.no_grad():  # the old policy and the teacher, before the step changes the policy
        s_all = torch.log_softmax(response_logits(policy, batch).float() / 0.8, -1)  # [N, T, V]
        t_all = torch.log_softmax(response_logits(teacher_model, batch).float() / 0.8, -1)
    trainer = TorchTrainer(policy, c, pad_id=PAD, teacher=ModelTeacher(teacher_model, 0.8, 3))
    tensors = trainer.forward_passes(batch, samples)
    assert tensors.teacher is None  # the top-k estimate replaces logp_old - logp_teacher
    expect = torch.zeros_like(batch.loss_mask)
    for i, smp in enumerate(samples):
        for j in range(smp.response_length):
            expect[i, j] = _formula(s_all[i, j].tolist(), t_all[i, j].tolist(), 3, strategy, mode)
    torch.testing.assert_close(tensors.opd_kl * batch.loss_mask, expect, atol=1e-4, rtol=1e-4)
    rollout, steps = trainer.train_rollout(samples, [s.reward for s in samples], 0)
    mask = batch.loss_mask
    assert rollout["rollout/opd_reverse_kl"] == pytest.approx(float((expect * mask).sum() / mask.sum()), abs=1e-4)
    assert "train/opd_reverse_kl" in steps[0]

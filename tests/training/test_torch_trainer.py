"""Torch trainer: micro-batching does not change the step; a step moves the weights toward
high-advantage samples; metrics carry the reference names."""

from __future__ import annotations

import copy

import torch

from miles_core.config import load_config
from miles_core.data.sample import Sample
from miles_core.training.torch_trainer import TorchTrainer


def _samples(tok, n_groups=2, group=4):
    out = []
    for g in range(n_groups):
        prompt = tok(f"{g}+1=")["input_ids"]
        for k in range(group):
            resp = tok("\\boxed{" + str(g + 1 + (k % 2)) + "}")["input_ids"][: 3 + k % 3]  # uneven lengths
            out.append(Sample(group_index=g, index=g * group + k, tokens=prompt + resp, response_length=len(resp),
                              loss_mask=[1] * len(resp), rollout_log_probs=[-1.0] * len(resp)))
    return out


def _trainer(model, tok, **over):
    cfg = load_config("tiny", {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "lr": 1e-3, **over})
    return TorchTrainer(model, cfg, pad_id=tok.pad_token_id)


def test_micro_batches_equal_one_batch(tiny_model_dir, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    samples = _samples(tiny_tokenizer)
    rewards = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    results = []
    for mbs in (8, 3, 1):
        model = copy.deepcopy(base)
        # adam_eps 1: the update is ~linear in the gradient, so float noise in near-zero gradients is not
        # amplified to +-lr as Adam's g / sqrt(v) would do; the weights then compare tightly.
        trainer = _trainer(model, tiny_tokenizer, micro_batch_size=mbs, adam_eps=1.0)
        _, steps = trainer.train_rollout(samples, rewards)
        results.append((steps[0], torch.cat([p.detach().flatten() for p in model.parameters()])))
    (m8, w8), (m3, w3), (m1, w1) = results
    for m in (m3, m1):
        for key in ("train/loss", "train/pg_loss", "train/entropy_loss", "train/grad_norm"):
            assert abs(m[key] - m8[key]) < 1e-5 * max(1.0, abs(m8[key])), (key, m[key], m8[key])
    w0 = torch.cat([p.detach().flatten() for p in base.parameters()])
    moved = (w8 - w0).abs().max()
    assert moved > 1e-6  # the step changed the weights
    assert (w3 - w8).abs().max() < 1e-3 * moved and (w1 - w8).abs().max() < 1e-3 * moved


def test_step_raises_logprob_of_rewarded_samples(tiny_model_dir, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trainer = _trainer(model, tiny_tokenizer, micro_batch_size=8)
    samples = _samples(tiny_tokenizer)
    rewards = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    from miles_core.training.batch import make_batch

    batch = make_batch(samples, tiny_tokenizer.pad_token_id)
    before = trainer.compute_log_probs(model, batch)
    rollout, steps = trainer.train_rollout(samples, rewards)
    after = trainer.compute_log_probs(model, batch)
    gain = ((after - before) * batch.loss_mask).sum(-1)  # [N]
    r = torch.tensor(rewards)
    assert gain[r == 1].mean() > gain[r == 0].mean()
    assert {"rollout/log_probs", "rollout/advantages", "perf/actor_train_time"} <= set(rollout)
    assert {"train/loss", "train/pg_clipfrac", "train/ppo_kl", "train/grad_norm", "train/lr-pg_0",
            "train/train_rollout_logprob_abs_diff"} <= set(steps[0])


def test_num_steps_per_rollout_gives_that_many_steps(tiny_model_dir, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trainer = _trainer(model, tiny_tokenizer, num_steps_per_rollout=2, micro_batch_size=4)
    _, steps = trainer.train_rollout(_samples(tiny_tokenizer), [1.0, 0.0] * 4)
    assert len(steps) == 2 and trainer.steps_done == 2
    assert steps[0]["train/ppo_kl"] == 0.0 and steps[1]["train/ppo_kl"] != 0.0  # second step is off-policy

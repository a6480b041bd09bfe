"""Torch trainer: micro-batching does not change the step; a step moves the weights toward
high-advantage samples; metrics carry the reference names."""

from __future__ import annotations

import copy

import pytest
import torch

from flows.recipes import load_config
from miles_core.training.torch_trainer import TorchTrainer
from ._samples import uneven_samples as _samples
from ._steps import one_step, tiny_trainer


_trainer = tiny_trainer


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
    before = trainer.engine.compute_log_probs(model, batch)
    rollout, steps = trainer.train_rollout(samples, rewards)
    after = trainer.engine.compute_log_probs(model, batch)
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
    # first step on-policy: ppo_kl 0 up to float rounding (the old pass and the step pack rows differently);
    # the second step is off-policy
    assert abs(steps[0]["train/ppo_kl"]) < 1e-7 and abs(steps[1]["train/ppo_kl"]) > 1e-5


# ---- the speed-ups are exact ---------------------------------------------------------------------
_one_step = one_step


def test_skipping_the_old_logprob_pass_gives_the_same_loss_and_gradients(tiny_model_dir, tiny_tokenizer, monkeypatch):
    """On-policy (1 step per rollout, no critic/KL/OPD): logp_old = logp.detach() of the step's own forward
    equals the recomputed old-policy pass, so ratio = 1 and loss, metrics and gradients agree."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    samples, rewards = _samples(tiny_tokenizer), [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    skipped = _one_step(copy.deepcopy(base), tiny_tokenizer, samples, rewards, micro_batch_size=3, use_tis=True)
    assert skipped[3].on_policy
    monkeypatch.setattr(TorchTrainer, "on_policy", property(lambda self: False))
    computed = _one_step(copy.deepcopy(base), tiny_tokenizer, samples, rewards, micro_batch_size=3, use_tis=True)
    for key in ("train/loss", "train/pg_loss", "train/entropy_loss", "train/ppo_kl", "train/pg_clipfrac",
                "train/train_rollout_logprob_abs_diff", "train/tis", "train/grad_norm"):
        assert abs(skipped[1][key] - computed[1][key]) < 1e-6 * max(1.0, abs(computed[1][key])), key
    assert abs(skipped[0]["rollout/log_probs"] - computed[0]["rollout/log_probs"]) < 1e-6
    for g1, g2 in zip(skipped[2], computed[2]):
        assert (g1 - g2).abs().max() <= 1e-6 * max(1.0, float(g2.abs().max()))


def test_old_logprob_pass_runs_when_it_is_not_redundant(tiny_model_dir, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert _trainer(model, tiny_tokenizer).on_policy
    assert not _trainer(model, tiny_tokenizer, num_steps_per_rollout=2, micro_batch_size=4).on_policy
    assert not _trainer(model, tiny_tokenizer, use_rollout_logprobs=True).on_policy
    model.config.attention_dropout = 0.1  # train-mode forward != eval-mode forward
    assert not _trainer(model, tiny_tokenizer).on_policy


def test_length_sorted_micro_batches_give_the_unsorted_gradient(tiny_model_dir, tiny_tokenizer, monkeypatch):
    """The loss is a sum over samples with global denominators: grouping rows differently only regroups the sum."""
    from transformers import AutoModelForCausalLM

    from miles_core.training import torch_trainer

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    samples, rewards = _samples(tiny_tokenizer), [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    lengths = [len(s.tokens) for s in samples]
    plan = torch_trainer.plan_micro_batches(list(range(8)), lengths, 3)
    assert plan != [[0, 1, 2], [3, 4, 5], [6, 7]] and all(lengths[a] <= lengths[b] for a, b in zip(sum(plan, []), sum(plan, [])[1:]))
    grouped = sum(torch_trainer.plan_micro_batches(list(range(8)), lengths, 3, unit=[0, 0, 0, 0, 1, 1, 1, 1]), [])
    assert sorted(grouped[:4]) in ([0, 1, 2, 3], [4, 5, 6, 7])  # a group's rows stay adjacent
    _, m_sorted, g_sorted, _ = _one_step(copy.deepcopy(base), tiny_tokenizer, samples, rewards, micro_batch_size=3)
    monkeypatch.setattr(torch_trainer, "plan_micro_batches", lambda rows, lengths, size, unit=None: [rows[s : s + size] for s in range(0, len(rows), size)])
    _, m_plain, g_plain, _ = _one_step(copy.deepcopy(base), tiny_tokenizer, samples, rewards, micro_batch_size=3)
    for key in ("train/loss", "train/pg_loss", "train/entropy_loss", "train/grad_norm"):
        assert abs(m_sorted[key] - m_plain[key]) < 1e-6 * max(1.0, abs(m_plain[key])), key
    for a, b in zip(g_sorted, g_plain):
        assert (a - b).abs().max() <= 1e-6 * max(1.0, float(b.abs().max()))


def test_torch_compile_gives_the_eager_step(tiny_model_dir, tiny_tokenizer):
    """--torch-compile: the decoder layers run through inductor from the first optimizer step on; two steps give the
    eager trainer's metrics and weights up to float rounding (fused kernels sum in another order)."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    samples = _samples(tiny_tokenizer)
    rewards = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    runs = []
    for compiled in (False, True):
        model = copy.deepcopy(base)
        trainer = _trainer(model, tiny_tokenizer, micro_batch_size=8, adam_eps=1.0, torch_compile=compiled)
        metrics = [trainer.train_rollout(samples, rewards)[1][0] for _ in range(2)]
        runs.append((metrics, torch.cat([p.detach().flatten() for p in model.parameters()]), model))
    (eager, w_eager, _), (comp, w_comp, model) = runs
    assert all(layer._compiled_call_impl is not None for layer in model.model.layers)
    assert counters["stats"]["unique_graphs"] > graphs  # the compiled layers ran
    for me, mc in zip(eager, comp):
        for key in ("train/loss", "train/pg_loss", "train/grad_norm"):
            assert abs(mc[key] - me[key]) < 1e-4 * max(1.0, abs(me[key])), (key, mc[key], me[key])
    moved = (w_eager - torch.cat([p.detach().flatten() for p in base.parameters()])).abs().max()
    assert moved > 1e-6 and (w_comp - w_eager).abs().max() < 1e-3 * moved


def test_torch_compile_needs_a_layer_list_and_the_torch_backend(tiny_tokenizer):
    class Flat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(2, 2)

    with pytest.raises(ValueError, match="torch_compile: the policy .*base_model.layers"):
        _trainer(Flat(), tiny_tokenizer, torch_compile=True)
    with pytest.raises(ValueError, match="torch_compile .*train_backend megatron"):
        load_config("tiny", {"torch_compile": True, "runtime": "ray", "train_backend": "megatron"})


def test_debug_disable_optimizer_computes_the_step_but_never_updates(tiny_model_dir, tiny_tokenizer):
    """The reference's --debug-disable-optimizer: the same losses and grad norm as a real step, the weights as loaded."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    w0 = torch.cat([p.detach().flatten() for p in base.parameters()])
    samples, rewards = _samples(tiny_tokenizer), [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    runs = {}
    for off in (False, True):
        model = copy.deepcopy(base)
        _, steps = _trainer(model, tiny_tokenizer, micro_batch_size=8, debug_disable_optimizer=off).train_rollout(samples, rewards)
        runs[off] = (steps[0], (torch.cat([p.detach().flatten() for p in model.parameters()]) - w0).abs().max())
    (real, moved), (debug, still) = runs[False], runs[True]
    assert moved > 1e-6 and still == 0
    assert debug["train/grad_norm"] == pytest.approx(real["train/grad_norm"], rel=1e-5) and debug["train/grad_norm"] > 0
    assert debug["train/loss"] == pytest.approx(real["train/loss"], rel=1e-5)
    with pytest.raises(ValueError, match="debug_disable_optimizer is not supported yet with train_backend megatron"):
        load_config("tiny", {"debug_disable_optimizer": True, "runtime": "ray", "train_backend": "megatron"})


def test_log_probs_chunk_size_takes_the_log_softmax_a_chunk_at_a_time(tiny_model_dir, tiny_tokenizer, monkeypatch):
    """The reference's --log-probs-chunk-size: the forward-only log-probs are the same, from log_softmax inputs of at most
    chunk positions ([N, 2, V] here, the uneven batch's T is 5) instead of the whole [N, T, V]."""
    from transformers import AutoModelForCausalLM

    from miles_core.training.batch import make_batch

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    batch = make_batch(_samples(tiny_tokenizer), tiny_tokenizer.pad_token_id)
    widths, real = [], torch.log_softmax
    monkeypatch.setattr(torch, "log_softmax", lambda x, dim: widths.append(x.shape[1]) or real(x, dim=dim))  # records, then computes
    whole = _trainer(model, tiny_tokenizer, micro_batch_size=8).engine.compute_log_probs(model, batch)
    assert widths == [batch.loss_mask.shape[1]] == [5]
    widths.clear()
    chunked = _trainer(model, tiny_tokenizer, micro_batch_size=8, log_probs_chunk_size=2).engine.compute_log_probs(model, batch)
    assert widths == [2, 2, 1]
    assert torch.allclose(chunked, whole, atol=1e-6)
    with pytest.raises(ValueError, match="log_probs_chunk_size is not supported yet with train_backend megatron"):
        load_config("tiny", {"log_probs_chunk_size": 2, "runtime": "ray", "train_backend": "megatron"})


def test_reset_optimizer_states_starts_each_rollout_with_a_fresh_adam(tiny_model_dir, tiny_tokenizer):
    """The reference's --reset-optimizer-states: the second rollout's update equals that of a fresh trainer over the
    weights after the first; without it the kept moments give another update."""
    from transformers import AutoModelForCausalLM

    def flat(m):
        return torch.cat([p.detach().flatten() for p in m.parameters()])

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    samples, first, second = _samples(tiny_tokenizer), [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    after, mid = {}, None
    for reset in (False, True):
        model = copy.deepcopy(base)
        trainer = _trainer(model, tiny_tokenizer, micro_batch_size=8, reset_optimizer_states=reset)
        trainer.train_rollout(samples, first)
        mid = copy.deepcopy(model)  # the same either way: the first rollout starts from an empty state
        trainer.train_rollout(samples, second)
        after[reset] = flat(model)
        assert all(int(s["step"]) == (1 if reset else 2) for s in trainer.engine.optimizer.state.values())
    fresh = copy.deepcopy(mid)
    _trainer(fresh, tiny_tokenizer, micro_batch_size=8).train_rollout(samples, second)
    update = (flat(fresh) - flat(mid)).norm()
    assert (after[True] - flat(fresh)).norm() <= 1e-5 * update
    assert (after[False] - flat(fresh)).norm() > 1e-2 * update  # the flag changes the update


def test_observe_training_entropy_logs_the_entropy_without_changing_the_step(tiny_model_dir, tiny_tokenizer):
    """entropy_coef 0: the entropy is not computed and train/entropy_loss is 0 (the reference); with
    observe_training_entropy it is computed and logged, detached: the same loss and update."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    samples, rewards = _samples(tiny_tokenizer), [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    out = {}
    for observe in (False, True):
        model = copy.deepcopy(base)
        _, steps = _trainer(model, tiny_tokenizer, observe_training_entropy=observe).train_rollout(samples, rewards)
        out[observe] = steps[0], torch.cat([p.detach().flatten() for p in model.parameters()])
    (off, w_off), (on, w_on) = out[False], out[True]
    assert off["train/entropy_loss"] == 0.0 and on["train/entropy_loss"] > 0.1  # a tiny random LM: high entropy
    assert on["train/loss"] == pytest.approx(off["train/loss"], rel=1e-6) and torch.equal(w_on, w_off)


def test_save_debug_train_data_dumps_what_the_steps_trained_on(tiny_model_dir, tiny_tokenizer, tmp_path):
    """The reference's --save-debug-train-data (and --dump-details' train_data/): per rollout and rank, the tokens,
    masks, rewards and the per-token tensors the steps used, one entry per sample."""
    from transformers import AutoModelForCausalLM

    samples, rewards = _samples(tiny_tokenizer), [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    template = str(tmp_path / "td" / "{rollout_id}_{rank}.pt")
    trainer = _trainer(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tiny_tokenizer, save_debug_train_data=template)
    rollout, _ = trainer.train_rollout(samples, rewards, 3)
    dump = torch.load(tmp_path / "td" / "3_0.pt", weights_only=True)
    data = dump["rollout_data"]
    assert dump["rollout_id"] == 3 and dump["rank"] == 0 and data["rewards"] == rewards and data["values"] is None
    assert [len(a) for a in data["advantages"]] == data["response_lengths"] == [s.response_length for s in samples]
    assert [a.tolist() for a in data["loss_masks"]] == [[float(m) for m in s.loss_mask] for s in samples]
    mask = torch.cat(data["loss_masks"])  # the logged means are over these tensors
    assert float((torch.cat(data["log_probs"]) * mask).sum() / mask.sum()) == pytest.approx(rollout["rollout/log_probs"], rel=1e-5)
    assert float((torch.cat(data["advantages"]) * mask).sum() / mask.sum()) == pytest.approx(rollout["rollout/advantages"], abs=1e-6)
    assert [bool(a[0] > 0) for a in data["advantages"]] == [r == 1.0 for r in rewards]  # GRPO: above its group's mean
    assert data["ref_log_probs"] is None and "rollout/ref_log_probs" not in rollout  # no reference model here
    cfg = load_config("tiny", {"dump_details": str(tmp_path / "dd"), "eval_prompt_data": None}).misc
    assert (cfg.train_dump, cfg.rollout_dump, cfg.trajectory_dump) == (
        f"{tmp_path}/dd/train_data/{{rollout_id}}_{{rank}}.pt", f"{tmp_path}/dd/rollout_data/{{rollout_id}}.pt",
        f"{tmp_path}/dd/trajectory/{{rollout_id}}.jsonl")
    with pytest.raises(ValueError, match="dump_details sets save_debug_train_data itself"):
        load_config("tiny", {"dump_details": "dd", "save_debug_train_data": template, "eval_prompt_data": None})


def test_log_correct_samples_logs_the_correct_samples_lengths_and_entropy(tiny_model_dir, tiny_tokenizer):
    """rollout/correct_*: over the samples with raw reward 1, their mean length, the shares per quarter of
    rollout_max_response_len, and -mean of their per-sample mean logp_old (= mean_log_probs before the step)."""
    from transformers import AutoModelForCausalLM

    samples, rewards = _samples(tiny_tokenizer), [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    plain = _trainer(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tiny_tokenizer)
    assert not any("correct" in k for k in plain.train_rollout(samples, rewards)[0])
    trainer = _trainer(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tiny_tokenizer, log_correct_samples=True)
    before = trainer.mean_log_probs(samples)  # the old policy's per-sample mean log-prob
    rollout, _ = trainer.train_rollout(samples, rewards)
    correct = [i for i, r in enumerate(rewards) if r == 1]
    lengths = [samples[i].response_length for i in correct]
    assert rollout["rollout/correct_response_lengths"] == pytest.approx(sum(lengths) / len(lengths))
    assert rollout["rollout/correct_entropy"] == pytest.approx(-sum(before[i] for i in correct) / len(correct), rel=1e-5)
    cuts = [12 / 4, 12 / 2, 12 * 3 / 4, 12]  # the tiny recipe's rollout_max_response_len 12
    shares = [sum(1 for n in lengths if n <= c and not any(n <= e for e in cuts[:j])) / len(lengths) for j, c in enumerate(cuts)]
    assert [rollout[f"rollout/correct_length/p{q}"] for q in (25, 50, 75, 100)] == pytest.approx(shares)


def _counting_log_probs(trainer) -> list[str]:
    """The roles of every forward-only log-prob pass the trainer runs from now on (a role without a model runs none)."""
    calls, log_probs = [], trainer.engine.log_probs

    def counted(role, batch):
        out = log_probs(role, batch)
        if out is not None:
            calls.append(role)
        return out

    trainer.engine.log_probs = counted
    return calls


def test_skip_actor_forward_only_takes_logp_old_from_the_step_even_when_the_engine_would_not(tiny_model_dir, tiny_tokenizer,
                                                                                             monkeypatch):
    """An engine that does not replay the step (data parallel, say) runs the old-policy pass; with
    skip_actor_forward_only it does not: logp_old = the step's own detached log-probs (the same step here, no
    dropout), and rollout/log_probs is not logged (the reference's train_actor)."""
    from transformers import AutoModelForCausalLM

    from miles_core.training.torch_trainer import TorchEngine

    monkeypatch.setattr(TorchEngine, "replays_step", property(lambda self: False))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    samples, rewards = _samples(tiny_tokenizer), [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    out = {}
    for skip in (False, True):
        trainer = _trainer(copy.deepcopy(base), tiny_tokenizer, micro_batch_size=3, skip_actor_forward_only=skip)
        calls = _counting_log_probs(trainer)
        rollout, steps = trainer.train_rollout(samples, rewards)
        out[skip] = calls, rollout, steps[0]
    assert out[False][0] == ["actor"] and out[True][0] == []
    assert "rollout/log_probs" in out[False][1] and "rollout/log_probs" not in out[True][1]
    for key in ("train/loss", "train/pg_loss", "train/ppo_kl", "train/grad_norm"):
        assert out[True][2][key] == pytest.approx(out[False][2][key], rel=1e-5, abs=1e-6), key
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.config.attention_dropout = 0.1  # train-mode forward != old policy: refused, as the reference
    with pytest.raises(ValueError, match="skip_actor_forward_only .* dropout"):
        _trainer(model, tiny_tokenizer, skip_actor_forward_only=True)


def test_disable_compute_advantages_and_returns_skips_the_passes_and_the_advantages(tiny_model_dir, tiny_tokenizer):
    """sft_loss reads only logp: with the flag no forward-only pass runs (not even the reference's, use_kl_loss off)
    and no advantage is computed (no rollout/advantages, rollout/log_probs, mismatch metrics); the step is the same."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    samples, rewards = _samples(tiny_tokenizer), [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    out = {}
    for disable in (False, True):
        model = copy.deepcopy(base)
        trainer = _trainer(model, tiny_tokenizer, loss_type="sft_loss", num_steps_per_rollout=2, micro_batch_size=4,
                           disable_compute_advantages_and_returns=disable)
        calls = _counting_log_probs(trainer)
        rollout, steps = trainer.train_rollout(samples, rewards)
        out[disable] = calls, rollout, steps, torch.cat([p.detach().flatten() for p in model.parameters()])
    (calls_on, r_on, s_on, w_on), (calls_off, r_off, s_off, w_off) = out[False], out[True]
    assert calls_on == ["actor"] and calls_off == []
    assert {"rollout/advantages", "rollout/log_probs"} <= r_on.keys() and not {"rollout/advantages", "rollout/log_probs"} & r_off.keys()
    assert "train/train_rollout_kl" in s_on[0] and "train/train_rollout_kl" not in s_off[0]
    assert [s["train/loss"] for s in s_off] == pytest.approx([s["train/loss"] for s in s_on], rel=1e-6)
    assert torch.allclose(w_on, w_off, atol=1e-7)


def sample_mean_reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss=False):
    """The reference's own sum_of_sample_mean (cp_utils.get_sum_of_sample_mean, CP 1), as a custom pg reducer."""
    return lambda x: sum((x_i * m_i).sum() / m_i.sum().clamp(min=1) for x_i, m_i in zip(x.split(response_lengths), loss_masks))


def test_custom_pg_loss_reducer_sees_each_row_s_response(tiny_model_dir, tiny_tokenizer, monkeypatch):
    """The trainer hands the reducer each row's response (uneven lengths, micro-batches of 3): the reference's
    default reducer written as a custom one, halved, gives half the default pg_loss (a misaligned row would not)."""
    import sys
    import types

    from transformers import AutoModelForCausalLM

    module = types.ModuleType("trainer_reducers")
    module.halved = lambda *a: (lambda x: sample_mean_reducer(*a)(x) / 2)
    monkeypatch.setitem(sys.modules, "trainer_reducers", module)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    samples, rewards = _samples(tiny_tokenizer), [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    pg = {}
    for path in (None, "trainer_reducers.halved"):
        trainer = _trainer(copy.deepcopy(base), tiny_tokenizer, micro_batch_size=3, custom_pg_loss_reducer_function_path=path,
                           disable_rewards_normalization=True)  # A = r: pg_loss is not 0 (GRPO's advantages sum to 0)
        pg[path] = trainer.train_rollout(samples, rewards)[1][0]["train/pg_loss"]
    assert pg[None] != 0.0
    assert pg["trainer_reducers.halved"] == pytest.approx(pg[None] / 2, rel=1e-6, abs=1e-9)


def test_use_rollout_entropy_logs_the_old_policy_s_entropy(tiny_model_dir, tiny_tokenizer):
    """The old-policy pass computes the entropy too (it then runs even on-policy): rollout/entropy = the mean over
    samples of each one's masked token mean, equal to the train step's own entropy at the same weights."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    samples, rewards = _samples(tiny_tokenizer), [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    plain = _trainer(copy.deepcopy(base), tiny_tokenizer)
    assert "rollout/entropy" not in plain.train_rollout(samples, rewards)[0]
    trainer = _trainer(copy.deepcopy(base), tiny_tokenizer, use_rollout_entropy=True, observe_training_entropy=True,
                       micro_batch_size=8)
    calls = _counting_log_probs(trainer)
    rollout, steps = trainer.train_rollout(samples, rewards)
    assert not trainer.on_policy and calls == []  # the pass ran through actor_log_probs_and_entropy
    # one optimizer step over all 8 rows: train/entropy_loss is R(H) at the same weights = the same per-sample mean
    assert rollout["rollout/entropy"] > 0.1 and rollout["rollout/entropy"] == pytest.approx(steps[0]["train/entropy_loss"], rel=1e-4)

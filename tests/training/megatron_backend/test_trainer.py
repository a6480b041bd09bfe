"""The Megatron trainer runs the torch trainer's math: one GRPO step on the same batch and weights gives
the same loss and grad norm (1e-5 relative) and the same weight update (within 1e-3 of its size), packed
(qkv_format thd, the default; use_dynamic_batch_size) or padded (bshd), dense or MoE; and a few rollouts move the policy toward reward."""

from __future__ import annotations

import copy

import pytest
import torch

from miles_core.training.megatron.trainer import MegatronTrainer
from miles_core.training.torch_trainer import TorchTrainer

from .conftest import tiny_hf

PAD = 0  # the tiny LMs' pad id (tests/training/conftest.py)
MEGATRON = {"runtime": "ray", "train_backend": "megatron"}  # a config the megatron-only fields validate under


def _updates(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before}


@pytest.mark.parametrize("model, overrides", [
    ("qwen2", {}),
    ("qwen2", {"use_kl_loss": True, "kl_loss_coef": 0.1, "entropy_coef": 0.01, "num_steps_per_rollout": 2, "micro_batch_size": 2}),
    ("qwen2", {"observe_training_entropy": True}),
    ("qwen2", {**MEGATRON, "use_dynamic_batch_size": True, "max_tokens_per_gpu": 24, "calculate_per_token_loss": True}),
    ("glm4_moe", {"micro_batch_size": 4}),
    ("qwen2", {**MEGATRON, "recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}),
    ("qwen2", {**MEGATRON, "recompute_granularity": "selective"}),
    ("qwen2", {**MEGATRON, "qkv_format": "bshd"}),  # padded micro-batches; the default thd packs them
])
def test_grpo_step_equals_the_torch_trainer(megatron_world, tmp_path, lm, cfg, samples, model, overrides):
    hf = lm(seed=0) if model == "qwen2" else tiny_hf(model)
    hf.save_pretrained(tmp_path)
    # the two trainers' own shapes (data_pad_size_multiplier 1): padding changes no number beyond float rounding, but
    # Adam at eps 1e-8 makes a near-zero gradient's update +-lr by its sign (tests/training/test_torch_trainer.py)
    cfg = cfg(**{"data_pad_size_multiplier": 1, **overrides})
    rewards = [s.reward for s in samples]
    ref = copy.deepcopy(hf) if cfg.needs_ref_model else None
    torch_trainer = TorchTrainer(copy.deepcopy(hf), cfg, pad_id=PAD, ref_model=ref)
    mega = MegatronTrainer(cfg, tmp_path, pad_id=PAD)
    before = {k: v.clone() for k, v in hf.state_dict().items()}
    torch_rollout, torch_steps = torch_trainer.train_rollout(samples, rewards)
    out = mega.train_rollout(samples, rewards)
    assert len(out.steps) == len(torch_steps) == cfg.num_steps_per_rollout
    for mine, theirs in zip(out.steps, torch_steps):
        assert set(theirs) <= set(mine)
        for key in ("train/loss", "train/pg_loss", "train/grad_norm", "train/entropy_loss"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-7), key
        assert (mine["train/entropy_loss"] > 0) == cfg.algo.train_entropy  # 0 when not computed, as the reference
    assert out.rollout["rollout/log_probs"] == pytest.approx(torch_rollout["rollout/log_probs"], rel=1e-5)
    ours, torch_upd = _updates(before, dict(mega.named_tensors())), _updates(before, torch_trainer.engine.model.state_dict())
    for name, upd in torch_upd.items():
        assert (ours[name] - upd).norm() <= 1e-3 * upd.norm() + 1e-12, name


def test_three_rollouts_move_the_policy_toward_reward(megatron_world, tmp_path, lm, cfg, samples):
    """Reward 1 on odd samples of each group: their mean log-prob rises and the others' falls."""
    lm(seed=1).save_pretrained(tmp_path)
    mega = MegatronTrainer(cfg(lr=3e-3), tmp_path, pad_id=PAD)
    rewards = [s.reward for s in samples]
    start = torch.tensor(mega.mean_log_probs(samples))
    losses = [mega.train_rollout(samples, rewards).steps[0]["train/pg_loss"] for _ in range(3)]
    end = torch.tensor(mega.mean_log_probs(samples))
    good = torch.tensor(rewards) == 1
    assert (end - start)[good].mean() > 0.05 and (end - start)[~good].mean() < -0.05
    assert mega.steps_done == 3 and all(torch.isfinite(torch.tensor(losses)))


def _adam_steps(optimizer) -> set[int]:
    """The step counts of the AdamW inside a trainer's optimizer (torch's, or megatron-core's wrapper around it)."""
    from miles_core.training.schedule import adam_optimizers

    return {int(s["step"]) for o in adam_optimizers(optimizer) for s in o.state.values()}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reset_optimizer_states_starts_each_rollout_with_a_fresh_adam(megatron_world, tmp_path, lm, cfg, samples, dtype):
    """The reference's --reset-optimizer-states on megatron-core's optimizers: in fp32 the second rollout's update
    equals a fresh trainer's over the weights after the first; in bf16 (Float16OptimizerWithFloat16Params around
    AdamW) the inner AdamW starts the rollout at step 0."""
    lm(seed=0).save_pretrained(tmp_path / "hf")
    first = [s.reward for s in samples]
    second = first[1:] + first[:1]
    trainers = {}
    for reset in (False, True):
        mega = MegatronTrainer(cfg(dtype=dtype, reset_optimizer_states=reset, **MEGATRON), tmp_path / "hf", pad_id=PAD)
        mega.train_rollout(samples, first)
        if reset:
            mega.engine.hf_model().save_pretrained(tmp_path / "mid")
        mega.train_rollout(samples, second)
        assert _adam_steps(mega.engine.optimizer) == {1 if reset else 2}
        trainers[reset] = mega
    if dtype != "float32":
        return  # the bf16 HF weights of the middle are not the fp32 main weights a fresh trainer would need
    fresh = MegatronTrainer(cfg(**MEGATRON), tmp_path / "mid", pad_id=PAD)
    mid = dict(fresh.named_tensors())
    fresh.train_rollout(samples, second)
    want = dict(fresh.named_tensors())
    update = torch.cat([(want[k] - mid[k]).flatten() for k in mid]).norm()
    for reset, mega in trainers.items():
        got = dict(mega.named_tensors())
        off = torch.cat([(got[k] - want[k]).flatten() for k in want]).norm()
        assert off <= 1e-5 * update if reset else off > 1e-2 * update, (reset, off, update)


def test_the_builder_makes_a_trainer_that_exports_hf(megatron_world, tmp_path, lm, cfg, samples, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    from miles_core.training.megatron import build_megatron_trainer
    from miles_core.training.protocol import TrainerContext, TrainOutput

    lm(seed=0).save_pretrained(tmp_path / "hf")
    trainer = build_megatron_trainer(TrainerContext(cfg=cfg(), model_path=tmp_path / "hf", tokenizer=tiny_tokenizer, rank=0, world_size=1))
    assert isinstance(trainer.train_rollout(samples, [s.reward for s in samples]), TrainOutput)
    path = trainer.export(tmp_path / "export", 0, tiny_tokenizer)
    assert (path / ".complete").is_file()
    exported = AutoModelForCausalLM.from_pretrained(path).state_dict()
    assert all(torch.equal(exported[k], v) for k, v in trainer.named_tensors())
    with pytest.raises(RuntimeError, match="says rank 1 of 2"):
        build_megatron_trainer(TrainerContext(cfg=cfg(), model_path=tmp_path / "hf", tokenizer=tiny_tokenizer, rank=1, world_size=2))


def test_a_nan_loss_stops_the_step_before_the_update_and_a_nan_weight_is_never_saved(megatron_world, tmp_path, lm, cfg, samples):
    """The reference's check_for_nan_in_loss_and_grad: a NaN reward that got past the reward checks makes the
    loss NaN; the step fails naming the rollout and step, the weights and the optimizer state are untouched."""
    from miles_core.finite import NonFiniteTraining

    lm(seed=0).save_pretrained(tmp_path / "hf")
    mega = MegatronTrainer(cfg(), tmp_path / "hf", pad_id=PAD)
    before = {k: v.clone() for k, v in mega.named_tensors()}
    rewards = [float("nan")] + [s.reward for s in samples[1:]]
    with pytest.raises(NonFiniteTraining, match="rollout 3, optimizer step 0: found NaN in the actor loss"):
        mega.train_rollout(samples, rewards, rollout_id=3)
    assert all(torch.equal(v, before[k]) for k, v in mega.named_tensors()) and not mega.engine.optimizer.state
    with torch.no_grad():
        next(mega.engine.model.parameters()).view(-1)[0] = float("inf")
    with pytest.raises(NonFiniteTraining, match="checkpoint 3 .* holds NaN or Inf"):
        mega.save(tmp_path / "ckpt", 3, {})
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())


def test_the_megatron_plugin_hooks_are_called_with_the_reference_signatures_at_its_points(megatron_world, tmp_path, lm, cfg,
                                                                                          samples):
    """custom_megatron_init_path after the parallel groups, the before-log-prob hook per forward-only pass (policy '',
    reference 'ref_'; eval mode), the before-train-step hook per optimizer step with its gradients zeroed, the
    post-save hook once the checkpoint is in place (megatron_utils/initialize.py, model.py, actor.py)."""
    import importlib

    mod = "tests.training.megatron_backend._hooks"
    hooks = importlib.import_module(mod)  # the module the trainer resolves the paths to
    hooks.CALLS.clear()
    lm(seed=0).save_pretrained(tmp_path / "hf")
    c = cfg(**MEGATRON, use_kl_loss=True, kl_loss_coef=0.1, num_steps_per_rollout=2, micro_batch_size=2,
            custom_megatron_init_path=f"{mod}.init", custom_megatron_before_log_prob_hook_path=f"{mod}.before_log_prob",
            custom_megatron_before_train_step_hook_path=f"{mod}.before_train_step",
            custom_megatron_post_save_hook_path=f"{mod}.post_save")
    mega = MegatronTrainer(c, tmp_path / "hf", pad_id=PAD)
    assert hooks.CALLS == [("init", 1, True)]
    mega.train_rollout(samples, [s.reward for s in samples], rollout_id=5)
    mega.save(tmp_path / "ckpt", 5, {})
    assert hooks.CALLS[1:] == [("log_prob", "", 1, False), ("log_prob", "ref_", 1, False),
                               ("train_step", 5, 0, True, None, 2, True), ("train_step", 5, 1, True, None, 2, True),
                               ("post_save", 5, "5", True, None)]


def test_recompute_loss_function_runs_the_loss_again_in_the_backward_with_the_same_step(megatron_world, tmp_path, lm, cfg,
                                                                                        samples):
    """The reference's --recompute-loss-function: the loss from the model's output is checkpointed, so the backward
    recomputes it (two loss passes per micro-batch instead of one) and the step is the same."""
    lm(seed=0).save_pretrained(tmp_path / "hf")
    rewards = [s.reward for s in samples]
    results = {}
    for recompute in (False, True):
        mega = MegatronTrainer(cfg(**MEGATRON, recompute_loss_function=recompute, entropy_coef=0.01), tmp_path / "hf", pad_id=PAD)
        calls = []
        piece = mega.engine._actor_piece
        mega.engine._actor_piece = lambda mb, out: calls.append(mb.rows) or piece(mb, out)  # counts the loss passes
        out = mega.train_rollout(samples, rewards)
        results[recompute] = (out.steps[0], dict(mega.named_tensors()), len(calls))
    (off_step, off_w, off_calls), (on_step, on_w, on_calls) = results[False], results[True]
    micro_batches = -(-len(samples) // cfg().algo.micro_batch_size)
    assert (off_calls, on_calls) == (micro_batches, 2 * micro_batches)
    for key in ("train/loss", "train/pg_loss", "train/grad_norm", "train/entropy_loss"):
        assert on_step[key] == pytest.approx(off_step[key], rel=1e-6, abs=1e-9), key
    assert all(torch.allclose(on_w[k], off_w[k], atol=1e-7) for k in off_w)


def test_offload_and_onload_park_every_stage_and_change_no_number(megatron_world, tmp_path, lm, cfg, samples):
    """offload_train on the Megatron trainer (bf16: megatron-core's optimizer with fp32 main weights; ppo: the critic's
    stage and optimizer too): offload leaves no byte of the train state on the device, onload brings it back, and two
    rollouts with an offload / onload between them equal two without, bit for bit; offload_train_target cpu parks
    the bytes in host copies, disk in files (<run_dir>/train_offload/train_state/rank0, removed on onload)."""
    lm(seed=0).save_pretrained(tmp_path)
    rewards = [s.reward for s in samples]
    files = tmp_path / "run" / "train_offload" / "train_state" / "rank0"
    runs = []
    for target in (None, "cpu", "disk"):
        over = {} if target is None else {"offload_train": True, "offload_train_target": target}
        config = cfg(dtype="bfloat16", advantage_estimator="ppo", run_dir=str(tmp_path / "run"), **MEGATRON, **over)
        mega = MegatronTrainer(config, tmp_path, pad_id=PAD)
        losses = [mega.train_rollout(samples, rewards, 0).steps[0]]
        if target is not None:
            resident = mega.where()
            mega.offload()
            parked = mega.where()
            on_disk = sum(f.stat().st_size for f in files.glob("*.bin")) if target == "disk" else 0
            assert parked.offloaded and parked.device_bytes == 0 and resident.host_bytes == 0
            assert (parked.host_bytes, parked.disk_bytes) == ((0, resident.device_bytes) if target == "disk" else
                                                              (resident.device_bytes, 0))
            assert on_disk == parked.disk_bytes
            mega.onload()
            assert mega.where() == resident and not list(files.glob("*"))
        losses.append(mega.train_rollout(samples, rewards, 1).steps[0])
        runs.append((losses, dict(mega.named_tensors())))
        mega.close()
    (l0, w0), *offloaded = runs
    for l1, w1 in offloaded:
        assert l0 == l1
        assert all(torch.equal(w0[k], w1[k]) for k in w0)


def test_padded_vocab_size_pads_the_embedding_and_changes_no_log_prob(megatron_world, tmp_path, cfg, samples):
    """padded_vocab_size 160 (vocab 128): the policy's embedding and output hold 160 rows, the 32 extra are masked out
    of the softmax, so the log-probs equal the unpadded model's; the HF tensors come back at 128 rows."""
    from miles_core.training.batch import make_batch

    tiny_hf("qwen2").save_pretrained(tmp_path / "hf")
    plain = MegatronTrainer(cfg(**MEGATRON), tmp_path / "hf", pad_id=PAD)
    padded = MegatronTrainer(cfg(**MEGATRON, padded_vocab_size=160), tmp_path / "hf", pad_id=PAD)
    assert (plain.engine.args.model_vocab_size, padded.engine.args.model_vocab_size) == (128, 160)
    rows = {n: p.shape[0] for n, p in padded.engine.model.named_parameters() if n.endswith(("word_embeddings.weight",
                                                                                                "output_layer.weight"))}
    assert rows and set(rows.values()) == {160}, rows
    batch = make_batch(samples, PAD)
    lp = [t.engine.compute_log_probs(t.engine.model, batch) for t in (plain, padded)]
    torch.testing.assert_close(lp[1], lp[0], rtol=1e-5, atol=1e-6)
    assert dict(padded.named_tensors())["model.embed_tokens.weight"].shape[0] == 128
    with pytest.raises(ValueError, match=r"padded_vocab_size \(120\) must be >= the model's vocab_size \(128\)"):
        MegatronTrainer(cfg(**MEGATRON, padded_vocab_size=120), tmp_path / "hf", pad_id=PAD)


def test_model_name_names_the_converter_of_the_checkpoint_s_family(megatron_world, tmp_path, cfg, samples):
    """model_name naming the converter of config.json's family builds the same model; another family's is refused."""
    tiny_hf("qwen3").save_pretrained(tmp_path / "hf")
    plain = MegatronTrainer(cfg(**MEGATRON), tmp_path / "hf", pad_id=PAD)
    for name in ("Qwen3ForCausalLM", "qwen2"):  # the reference's qwen2 converter serves qwen3 too
        assert MegatronTrainer(cfg(**MEGATRON, model_name=name), tmp_path / "hf", pad_id=PAD).engine.args == plain.engine.args
    with pytest.raises(ValueError, match="model_name 'llama' names the converter of llama, but .* is model_type qwen3"):
        MegatronTrainer(cfg(**MEGATRON, model_name="llama"), tmp_path / "hf", pad_id=PAD)


def test_data_pad_size_multiplier_pads_the_micro_batches_and_changes_no_log_prob(megatron_world, tmp_path, cfg, samples):
    """thd: each packed micro-batch gets a pad segment up to a multiple of 64 tokens (its own cu_seqlens entry); bshd:
    columns up to 64; the log-probs equal those of the unpadded micro-batches."""
    from miles_core.training.batch import make_batch
    from miles_core.training.megatron import batching

    batch = make_batch(samples, PAD)
    for qkv, thd in (("thd", False), ("thd", True), ("bshd", False)):
        mbs = batching.plan(batch, list(range(len(batch))), 3, None, qkv, pad_to=64, thd=thd)
        assert all(mb.input_ids.shape[-1] == 64 for mb in mbs), qkv
        if thd:
            assert all(int(mb.packed_seq_params.cu_seqlens_q[-1]) == 64 for mb in mbs)
    tiny_hf("qwen2").save_pretrained(tmp_path / "hf")
    lp = {}
    for m in (1, 64):
        for qkv in ("thd", "bshd"):
            t = MegatronTrainer(cfg(**MEGATRON, data_pad_size_multiplier=m, qkv_format=qkv), tmp_path / "hf", pad_id=PAD)
            lp[m, qkv] = t.engine.compute_log_probs(t.engine.model, batch)
    for qkv in ("thd", "bshd"):
        torch.testing.assert_close(lp[64, qkv], lp[1, qkv], rtol=1e-5, atol=1e-6)


def test_balance_by_flops_splits_the_packed_rows_by_estimated_flops(megatron_world, tmp_path, cfg, samples):
    """ceil(tokens / max_tokens_per_gpu) micro-batches of near-equal FLOPs (attention quadratic: a long sample weighs
    more than its tokens), where first-fit packs by tokens; the step is the same either way."""
    from miles_core.training.megatron import batching
    from miles_core.training.megatron.flops import fwd_flops
    from miles_core.training.megatron.model_args import from_hf_config

    args = from_hf_config(tiny_hf("qwen2").config.to_dict())
    lengths = [60, 50, 50, 40]  # 200 tokens, max 150: 2 micro-batches; first-fit fills one to 150 (60 + 50 + 40)
    flops = [fwd_flops(n, args) for n in lengths]
    assert fwd_flops(120, args) > 2 * fwd_flops(60, args)  # the quadratic attention term
    groups = batching.flops_groups(lengths, 150, lambda n: fwd_flops(n, args))
    by_flops = sorted(sum(flops[i] for i in g) for g in groups)
    first_fit = sorted(sum(flops[i] for i in g) for g in batching.pack_rows(lengths, 150))
    assert sorted(map(sorted, groups)) == [[0, 3], [1, 2]]  # 100 tokens each
    assert by_flops[1] - by_flops[0] < (first_fit[1] - first_fit[0]) / 10
    assert batching.flops_groups([10, 10], 5, len) == [[0], [1]]  # as many micro-batches as samples: one each

    tiny_hf("qwen2").save_pretrained(tmp_path / "hf")
    dyn = {**MEGATRON, "use_dynamic_batch_size": True, "max_tokens_per_gpu": 24}
    steps = [MegatronTrainer(cfg(**dyn, balance_by_flops=b, adam_eps=1.0), tmp_path / "hf", pad_id=PAD)
             .train_rollout(samples, [s.reward for s in samples]).steps[0] for b in (False, True)]
    assert steps[1]["train/loss"] == pytest.approx(steps[0]["train/loss"], rel=1e-5, abs=1e-7)
    assert steps[1]["train/grad_norm"] == pytest.approx(steps[0]["train/grad_norm"], rel=1e-4)


def test_on_policy_the_old_logprob_pass_is_skipped_with_the_same_step(megatron_world, tmp_path, lm, cfg, samples, monkeypatch):
    """One data-parallel rank, one step per rollout, no KL / critic / OPD: the Megatron engine replays the step
    (replays_step), so the old-policy pass is skipped and logp_old is the step's own detached log-probs: the same loss,
    metrics, grad norm and update as with the pass (rl_step.on_policy)."""
    from miles_core.training.megatron.trainer import MegatronEngine

    lm(seed=0).save_pretrained(tmp_path)
    rewards = [s.reward for s in samples]
    out = {}
    for replays in (True, False):
        if not replays:
            monkeypatch.setattr(MegatronEngine, "replays_step", property(lambda self: False))
        trainer = MegatronTrainer(cfg(micro_batch_size=3, use_tis=True), tmp_path, pad_id=PAD)
        calls = []
        log_probs = trainer.engine.log_probs
        trainer.engine.log_probs = lambda role, batch: calls.append(role) or log_probs(role, batch)
        assert trainer.on_policy == replays
        rollout, steps = trainer.train_rollout(samples, rewards)
        out[replays] = calls, rollout, steps[0], dict(trainer.named_tensors())
    assert "actor" not in out[True][0] and out[False][0].count("actor") == 1
    for key in ("train/loss", "train/pg_loss", "train/ppo_kl", "train/pg_clipfrac", "train/tis", "train/grad_norm"):
        assert out[True][2][key] == pytest.approx(out[False][2][key], rel=1e-5, abs=1e-7), key
    assert out[True][1]["rollout/log_probs"] == pytest.approx(out[False][1]["rollout/log_probs"], rel=1e-6)
    for name, w in out[False][3].items():
        torch.testing.assert_close(out[True][3][name], w, rtol=0, atol=1e-7)


def test_the_output_layer_runs_at_the_response_positions_only(megatron_world, tmp_path, lm, cfg, sample_factory):
    """batching.output_at_responses: the LM head gets the n x T positions that predict response tokens, not every
    position of the packed sequence (prompts, pad segment), with the same logits there. (The step's loss, gradients
    and update through it: test_grpo_step_equals_the_torch_trainer, bshd and critic cases included.)"""
    from miles_core.training.batch import make_batch
    from miles_core.training.megatron import batching

    lm(seed=0).save_pretrained(tmp_path)
    engine = MegatronTrainer(cfg(), tmp_path, pad_id=PAD).engine
    batch = make_batch(sample_factory(n_groups=2, group_size=4, seed=1), pad_id=PAD)  # 8 responses of 1-6 tokens
    stage, seen = engine.model.eval(), []
    handle = engine.model.module.output_layer.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[0]))
    for pad_to in (64, 1):  # a pad segment up to 64 positions: the head at n x T = 48 of them; no pad: 32 < 48, all
        [mb] = batching.plan(batch, list(range(len(batch))), len(batch), None, "thd", pad_to, engine.workload,
                             share_prompts=engine.share_prompts)
        seen.clear()
        with torch.no_grad():
            full = stage(input_ids=mb.input_ids, position_ids=mb.position_ids, packed_seq_params=mb.packed_seq_params,
                         attention_mask=None)
            with batching.output_at_responses(stage, mb) as picked:
                part = stage(input_ids=mb.input_ids, position_ids=mb.position_ids, packed_seq_params=mb.packed_seq_params,
                             attention_mask=None)
        n, T = mb.flat_index.shape
        W = mb.input_ids.shape[1]
        assert seen == [W, min(n * T, W)] and picked.rows == mb.rows, (pad_to, seen, n * T)
        V = full.shape[-1]
        torch.testing.assert_close(part.reshape(-1, V)[picked.flat_index], full.reshape(-1, V)[mb.flat_index],
                                   rtol=1e-5, atol=1e-5)
    handle.remove()

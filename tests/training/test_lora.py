"""LoRA in the torch trainer (miles_core/training/lora.py): a GRPO step moves the adapters only and equals the same
step of a PEFT model built by hand; the engines get the merged weights under the base names; a checkpoint holds the
adapters and refuses another base; the export is a PEFT adapter dir that PeftModel.from_pretrained loads."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from flows.recipes import load_config
from miles_core.algorithms import AdvantageInputs, LossInputs, Reducer, actor_loss, compute_advantages, entropy_from_logits
from miles_core.data.sample import Sample
from miles_core.training.batch import at_response, forward, make_batch
from miles_core.training.lora import LoraAdapters, LoraError, is_adapter
from miles_core.training.torch_trainer import TorchTrainer
from ._samples import uneven_samples as _samples

LORA = {"lora_rank": 4, "lora_alpha": 8, "target_modules": "all-linear"}
REWARDS = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0]


CFG = {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "lr": 1e-2, "micro_batch_size": 8}


def _cfg(**over):
    return load_config("tiny", {**CFG, **LORA, **over})


def _trainer(base, tok, seed=0, **over):
    cfg = _cfg(**over)
    torch.manual_seed(seed)  # the adapters' init (PEFT draws A from torch's RNG)
    return TorchTrainer(copy.deepcopy(base), cfg, pad_id=tok.pad_token_id, lora=LoraAdapters(cfg.lora, str(cfg.checkpoint.hf_checkpoint)))


@pytest.fixture(scope="module")
def base(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def _hand_built_step(base, tok, cfg, samples):
    """The same GRPO step on peft.get_peft_model(base): padded forward, our loss, clip, AdamW -> (metrics, model)."""
    from peft import get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(copy.deepcopy(base), LoraAdapters(cfg.lora).peft_config())
    batch = make_batch(samples, tok.pad_token_id)
    logits = at_response(forward(model, batch).logits, batch).float() / cfg.rollout.rollout_temperature  # [N, T, V]
    logp = torch.log_softmax(logits, -1).gather(-1, batch.resp_tokens[..., None]).squeeze(-1)  # [N, T]
    adv, _, _ = compute_advantages(cfg.algo, AdvantageInputs(
        rewards=torch.tensor(REWARDS), group_index=torch.tensor([s.group_index for s in samples]), loss_mask=batch.loss_mask,
        old_log_probs=logp.detach(), ref_log_probs=None, values=None, teacher_log_probs=None))
    reduce = Reducer(cfg.algo.calculate_per_token_loss, num_samples=len(samples), num_tokens=float(batch.loss_mask.sum()))
    loss, metrics = actor_loss(cfg.algo, LossInputs(log_probs=logp, old_log_probs=logp.detach(), advantages=adv,
                                                    loss_mask=batch.loss_mask, entropy=entropy_from_logits(logits.detach()) if cfg.algo.train_entropy else None,
                                                    rollout_log_probs=batch.rollout_log_probs), reduce)
    loss.backward()
    trained = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(trained, cfg.algo.clip_grad)
    a = cfg.algo
    torch.optim.AdamW(trained, lr=a.lr, betas=(a.adam_beta1, a.adam_beta2), eps=a.adam_eps, weight_decay=a.weight_decay).step()
    return {"loss": float(loss.detach()), "grad_norm": float(grad_norm), **{k: float(v) for k, v in metrics.items()}}, model


def test_a_grpo_step_moves_only_the_adapters_and_equals_a_hand_built_peft_step(base, tiny_tokenizer):
    samples = _samples(tiny_tokenizer)
    # adam_eps 1: the update is ~linear in the gradient, so float noise in near-zero gradients is not amplified to
    # +-lr as Adam's g / sqrt(v) would do (test_torch_trainer.py); the adapters then compare tightly
    trainer = _trainer(base, tiny_tokenizer, adam_eps=1.0)
    model = trainer.engine.model
    before = {n: t.clone() for n, t in model.state_dict().items()}
    assert all(p.requires_grad == is_adapter(n) for n, p in model.named_parameters())
    assert {id(p) for g in trainer.engine.optimizer.param_groups for p in g["params"]} == \
        {id(p) for n, p in model.named_parameters() if is_adapter(n)}  # AdamW over the adapters only
    _, steps = trainer.train_rollout(samples, REWARDS)
    after = model.state_dict()
    base_names = [n for n in after if not is_adapter(n)]
    assert all(torch.equal(after[n], before[n]) for n in base_names)  # every base tensor bit-identical
    assert any(not torch.equal(after[n], before[n]) for n in after if ".lora_B." in n)  # the adapters moved

    hand, peft_model = _hand_built_step(base, tiny_tokenizer, _cfg(adam_eps=1.0), samples)
    for key in ("loss", "pg_loss", "entropy_loss", "grad_norm"):
        ours = steps[0][f"train/{key}"]
        assert abs(ours - hand[key]) <= 1e-5 * max(1.0, abs(hand[key])), (key, ours, hand[key])
    theirs = {k.replace("base_model.model.", ""): v for k, v in peft_model.state_dict().items()}
    for n in after:
        if is_adapter(n):  # the same init (same seed, same order) and the same update
            assert torch.allclose(after[n], theirs[n], atol=1e-6, rtol=1e-5), n


def test_the_merged_weights_are_the_base_names_with_w_plus_scaled_ba(base, tiny_tokenizer):
    trainer = _trainer(base, tiny_tokenizer)
    trainer.train_rollout(_samples(tiny_tokenizer), REWARDS)
    merged = dict(trainer.named_tensors())
    assert set(merged) == set(base.state_dict())  # the base model's own names, no adapter tensor
    reference = copy.deepcopy(trainer.engine.model)
    from peft.tuners.lora import LoraLayer

    for m in reference.modules():
        if isinstance(m, LoraLayer):
            m.merge()  # PEFT's own merge: W += scaling * B A
    plain = {n.replace(".base_layer", ""): t for n, t in reference.state_dict().items() if not is_adapter(n)}
    changed = 0
    for n, t in merged.items():
        assert torch.allclose(t, plain[n], atol=1e-7), n
        changed += not torch.equal(t, base.state_dict()[n])
    assert changed > 0


def test_after_a_sync_the_engine_sampled_log_probs_equal_the_trainer_within_1e_5(base, tiny_tokenizer, one_torch_thread):
    from miles_core.rollout.hf_engine import HFEngine
    from miles_core.rollout.protocol import GenerateRequest, SamplingParams
    from miles_core.weights.sync import sync_weights

    trainer = _trainer(base, tiny_tokenizer)
    trainer.train_rollout(_samples(tiny_tokenizer), REWARDS)
    engine = HFEngine(copy.deepcopy(base), tiny_tokenizer)
    sync_weights(trainer.named_tensors(), [engine], version=1, max_bytes=1 << 16)  # in buckets, as a run does
    prompts = [tiny_tokenizer(f"{g}+1=")["input_ids"] for g in range(4)]
    results = engine.generate([GenerateRequest(p, SamplingParams(max_new_tokens=6)) for p in prompts], seed=3)
    samples = [Sample(group_index=i, index=i, tokens=p + r.output_ids, response_length=len(r.output_ids),
                      loss_mask=[1] * len(r.output_ids), rollout_log_probs=r.output_log_probs)
               for i, (p, r) in enumerate(zip(prompts, results))]
    assert all(r.weight_version == 1 for r in results)
    batch = make_batch(samples, tiny_tokenizer.pad_token_id)
    ours = trainer.engine.compute_log_probs(trainer.engine.model, batch)  # [N, T]
    before = trainer.engine.compute_log_probs(base, batch)
    mask = batch.loss_mask.bool()
    assert (ours - before)[mask].abs().max() > 1e-4  # the step moved the policy away from the base ...
    assert (ours - batch.rollout_log_probs)[mask].abs().max() < 1e-5  # ... and the engine samples from the trained one


def test_a_checkpoint_holds_the_adapters_resumes_exactly_and_refuses_another_base(base, tiny_tokenizer, tmp_path):
    samples = _samples(tiny_tokenizer)
    a = _trainer(base, tiny_tokenizer)
    a.train_rollout(samples, REWARDS, rollout_id=0)
    a.save(tmp_path / "ckpt", 0, {})
    saved = json.loads((tmp_path / "ckpt" / "0" / "meta.json").read_text())
    assert saved["lora_base_sha256"] == a.engine.lora.base_sha256
    from safetensors import safe_open

    with safe_open(str(next((tmp_path / "ckpt" / "0" / "model").glob("*.safetensors"))), "pt") as f:
        assert f.keys() and all(is_adapter(k) for k in f.keys())  # no frozen base in the checkpoint
    _, steps_a = a.train_rollout(samples, REWARDS, rollout_id=1)

    b = _trainer(base, tiny_tokenizer, seed=99)  # other adapters' init: the checkpoint's replace them
    assert b.restore(tmp_path / "ckpt")["steps_done"] == 1
    _, steps_b = b.train_rollout(samples, REWARDS, rollout_id=1)
    assert steps_b == steps_a  # the same metrics, to the bit
    assert all(torch.equal(x, y) for x, y in zip(a.engine.model.state_dict().values(), b.engine.model.state_dict().values()))

    from miles_core.checkpoint.convert import checkpoint_to_hf
    from miles_core.checkpoint.errors import CheckpointError

    with pytest.raises(CheckpointError, match="LoRA checkpoint holds the adapters only"):  # not a half model
        checkpoint_to_hf(tmp_path / "ckpt" / "0", tmp_path, tmp_path / "hf", 0)

    other = copy.deepcopy(base)
    with torch.no_grad():
        next(other.parameters()).add_(1e-3)
    c = _trainer(other, tiny_tokenizer)
    with pytest.raises(LoraError, match="different base model"):
        c.restore(tmp_path / "ckpt")


def test_the_export_is_a_peft_adapter_dir_and_a_merged_hf_model(base, tiny_tokenizer, tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trainer = _trainer(base, tiny_tokenizer)
    samples = _samples(tiny_tokenizer)
    trainer.train_rollout(samples, REWARDS)
    out = trainer.export(tmp_path / "export", 0, tiny_tokenizer)
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in (out / "adapter").iterdir()}
    batch = make_batch(samples, tiny_tokenizer.pad_token_id)
    ours = forward(trainer.engine.model.eval(), batch).logits
    fresh = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(fresh, out / "adapter").eval()
    with torch.no_grad():
        assert (forward(peft_model, batch).logits - ours).abs().max() < 1e-5
        merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        assert (forward(merged, batch).logits - ours).abs().max() < 1e-5

    again = _trainer(base, tiny_tokenizer, seed=7, lora_adapter_path=str(out / "adapter"))  # start from the export
    got = {n: t for n, t in again.engine.model.state_dict().items() if is_adapter(n)}
    assert all(torch.equal(t, trainer.engine.model.state_dict()[n]) for n, t in got.items())
    with pytest.raises(LoraError, match="its r is 4"):
        _trainer(base, tiny_tokenizer, lora_rank=8, lora_adapter_path=str(out / "adapter"))


def _engine_samples(engine, tok, prompts, seed):
    from miles_core.rollout.protocol import GenerateRequest, SamplingParams

    results = engine.generate([GenerateRequest(p, SamplingParams(max_new_tokens=6)) for p in prompts], seed=seed)
    samples = [Sample(group_index=i, index=i, tokens=p + r.output_ids, response_length=len(r.output_ids),
                      loss_mask=[1] * len(r.output_ids), rollout_log_probs=r.output_log_probs)
               for i, (p, r) in enumerate(zip(prompts, results))]
    return make_batch(samples, tok.pad_token_id), results


def test_lora_sync_from_tensor_sends_the_adapter_alone_over_http_and_the_engine_serves_the_trainer(base, tiny_tokenizer,
                                                                                                   one_torch_thread):
    """Adapter mode over our HTTP server: after each sync the engine (base + adapter, unmerged) samples with the trainer's
    log-probs within 1e-5; its base weights are never sent; the bodies are SGLang 0.5.23's (the protocol snapshot)."""
    from miles_core.rollout.adapters import ThroughAdapter
    from miles_core.rollout.hf_engine import HFEngine
    from miles_core.rollout.http import serve_in_thread
    from miles_core.rollout.http.router import EngineRouter
    from miles_core.rollout.sglang.protocol import Call, request_problems
    from miles_core.rollout.http import wire
    from miles_core.weights.sync import LORA_ADAPTER_NAME, WeightSender, WeightSync

    trainer = _trainer(base, tiny_tokenizer, lora_sync_from_tensor=True)
    engine = HFEngine(copy.deepcopy(base), tiny_tokenizer, batching="exact")
    handle = serve_in_thread(engine)
    router = EngineRouter.from_urls([handle.url])
    sender = WeightSender(trainer.named_tensors, adapter=trainer.adapter_tensors)
    sync = WeightSync("tensor", 1 << 16, lora_adapter=True)
    through = ThroughAdapter(router, LORA_ADAPTER_NAME)
    prompts = [tiny_tokenizer(f"{g}+1=")["input_ids"] for g in range(4)]
    base_weights = {k: v.clone() for k, v in base.state_dict().items()}
    try:
        for version in (1, 2):
            trainer.train_rollout(_samples(tiny_tokenizer), REWARDS, rollout_id=version - 1)
            sync.sync(sender, router, version)
            batch, results = _engine_samples(through, tiny_tokenizer, prompts, seed=version)
            assert all(r.weight_version == version for r in results)
            mask = batch.loss_mask.bool()
            ours = trainer.engine.compute_log_probs(trainer.engine.model, batch)  # [N, T]
            assert (ours - trainer.engine.compute_log_probs(base, batch))[mask].abs().max() > 1e-4  # trained off the base
            assert (ours - batch.rollout_log_probs)[mask].abs().max() < 1e-5  # the engine serves base + this adapter
        served = engine.model.state_dict()  # an adapted layer's base is <module>.base_layer.<leaf> there
        at = lambda k: k if k in served else ".base_layer.".join(k.rsplit(".", 1))  # noqa: E731
        assert all(torch.equal(served[at(k)], v) for k, v in base_weights.items())  # no base tensor was sent
        plain, _ = _engine_samples(router, tiny_tokenizer, prompts, seed=5)  # no lora_path: the base model
        assert (trainer.engine.compute_log_probs(base, plain) - plain.rollout_log_probs)[plain.loss_mask.bool()].abs().max() < 1e-5
        config, tensors = trainer.adapter_tensors()
        calls = [Call("POST", "/load_lora_adapter_from_tensors", wire.adapter_body(LORA_ADAPTER_NAME, config, tensors)),
                 Call("POST", "/unload_lora_adapter", {"lora_name": LORA_ADAPTER_NAME}),
                 Call("POST", "/generate", wire.generate_body([r for r in _requests(prompts, LORA_ADAPTER_NAME)], [1] * 4))]
        assert request_problems(calls) == []
        assert request_problems([Call("POST", "/load_lora_adapter_from_tensors", {"lora_name": "x", "adapter": 1})])  # can fail
    finally:
        router.close()
        handle.stop()


def _requests(prompts, lora):
    from miles_core.rollout.protocol import GenerateRequest, SamplingParams

    return [GenerateRequest(p, SamplingParams(max_new_tokens=2), lora_path=lora) for p in prompts]


def test_the_server_refuses_sglang_pickles_and_unknown_adapters(base, tiny_tokenizer):
    import httpx

    from miles_core.rollout.hf_engine import HFEngine
    from miles_core.rollout.http import serve_in_thread

    handle = serve_in_thread(HFEngine(copy.deepcopy(base), tiny_tokenizer, batching="exact"))
    try:
        pickled = httpx.post(handle.url + "/load_lora_adapter_from_tensors", json={
            "lora_name": "a", "config_dict": {"r": 4}, "serialized_named_tensors": ["gASVAAAAAAAAAAAu"]})
        assert pickled.status_code == 400 and "load_format" in pickled.text
        body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}, "lora_path": "nope"}
        unknown = httpx.post(handle.url + "/generate", json=body)
        assert unknown.status_code == 400 and "no such LoRA adapter" in unknown.text
    finally:
        handle.stop()


def test_lora_train_only_syncs_the_frozen_base_and_never_the_adapters(base, tiny_tokenizer):
    trainer = _trainer(base, tiny_tokenizer, lora_train_only=True)
    trainer.train_rollout(_samples(tiny_tokenizer), REWARDS)
    sent = dict(trainer.named_tensors())
    assert sent.keys() == base.state_dict().keys()
    assert all(torch.equal(sent[k], v) for k, v in base.state_dict().items())  # the base, as loaded
    merged = _trainer(base, tiny_tokenizer)
    merged.train_rollout(_samples(tiny_tokenizer), REWARDS)
    assert any(not torch.equal(t, sent[k]) for k, t in merged.named_tensors())  # without it: the trained, merged weights


def test_the_in_process_fleet_in_adapter_mode_loads_the_adapter_and_serves_every_request_through_it(base, tiny_tokenizer):
    """The local runtime's path: InProcessFleet(lora_adapter=True) reloads the adapter at each sync (no base sent) and its
    engine stamps lora_path on every request; a second sync replaces the first adapter."""
    from miles_core.rollout.fleet import InProcessFleet
    from miles_core.rollout.hf_engine import HFEngine
    from miles_core.runtime.local import LocalWeights

    trainer = _trainer(base, tiny_tokenizer, lora_sync_from_tensor=True)
    engine = HFEngine(copy.deepcopy(base), tiny_tokenizer, batching="exact")
    fleet = InProcessFleet(engine, 1 << 16, lora_adapter=True)
    prompts = [tiny_tokenizer(f"{g}+2=")["input_ids"] for g in range(2)]
    for version in (1, 2):
        trainer.train_rollout(_samples(tiny_tokenizer), REWARDS, rollout_id=version - 1)
        fleet.update_weights(LocalWeights(trainer), version)
        batch, results = _engine_samples(fleet.engine, tiny_tokenizer, prompts, seed=version)
        ours = trainer.engine.compute_log_probs(trainer.engine.model, batch)
        assert (ours - batch.rollout_log_probs)[batch.loss_mask.bool()].abs().max() < 1e-5
    assert engine.adapters.loaded == {"miles_lora"} and engine.weight_version == 2
    plain, _ = _engine_samples(engine, tiny_tokenizer, prompts, seed=2)  # the raw engine, no lora_path: the base
    assert (trainer.engine.compute_log_probs(base, plain) - plain.rollout_log_probs)[plain.loss_mask.bool()].abs().max() < 1e-5


# The killed run: rollout 0, its checkpoint, then rollout 1, during which the parent SIGKILLs it.
_KILLED_RUN = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from _samples import uneven_samples
from transformers import AutoModelForCausalLM, AutoTokenizer
from flows.recipes import load_config
from miles_core.training.lora import LoraAdapters
from miles_core.training.torch_trainer import TorchTrainer
model_dir, ckpt, over, rewards = sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), json.loads(sys.argv[5])
torch.set_num_threads(1)
tok = AutoTokenizer.from_pretrained(model_dir)
cfg = load_config("tiny", over)
torch.manual_seed(0)
t = TorchTrainer(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), cfg, pad_id=tok.pad_token_id,
                 lora=LoraAdapters(cfg.lora, str(cfg.checkpoint.hf_checkpoint)))
t.train_rollout(uneven_samples(tok), rewards, rollout_id=0)
t.save(ckpt, 0, {})
print("saved", flush=True)
while True:
    t.train_rollout(uneven_samples(tok), rewards, rollout_id=1)
"""


def test_sigkill_after_a_lora_checkpoint_and_rerun_gives_the_uninterrupted_runs_metrics(base, tiny_tokenizer, tiny_model_dir,
                                                                                         tmp_path, one_torch_thread):
    """A process trains rollout 0 with LoRA, checkpoints (adapters, Adam state, RNG, base sha256) and is SIGKILLed in
    rollout 1; a fresh trainer with other adapters restores it and trains rollout 1: every metric of every step, and
    every tensor, equals the uninterrupted run's. (The flow-level SIGKILL e2e, tests/e2e/test_resume.py, costs two flow
    runs; this is the trainer's part of it.)"""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    over = {**CFG, **LORA}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", _KILLED_RUN, str(Path(__file__).parent), str(tiny_model_dir),
                              str(tmp_path / "ckpt"), json.dumps(over), json.dumps(REWARDS)],
                             stdout=subprocess.PIPE, text=True, env=env, cwd=root)
    try:
        assert child.stdout.readline().strip() == "saved"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL

    whole = _trainer(base, tiny_tokenizer)  # the uninterrupted run, in this process
    whole.train_rollout(_samples(tiny_tokenizer), REWARDS, rollout_id=0)
    rerun = _trainer(base, tiny_tokenizer, seed=99)
    assert rerun.restore(tmp_path / "ckpt")["steps_done"] == 1
    out_whole = whole.train_rollout(_samples(tiny_tokenizer), REWARDS, rollout_id=1)
    out_rerun = rerun.train_rollout(_samples(tiny_tokenizer), REWARDS, rollout_id=1)
    untimed = lambda m: {k: v for k, v in m.items() if not k.startswith("perf/")}  # noqa: E731
    assert [untimed(m) for m in out_rerun[1]] == [untimed(m) for m in out_whole[1]]  # every step's metrics
    assert untimed(out_rerun[0]) == untimed(out_whole[0])  # the rollout's
    assert all(torch.equal(x, y) for x, y in zip(whole.engine.model.state_dict().values(),
                                                 rerun.engine.model.state_dict().values()))

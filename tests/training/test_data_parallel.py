"""FSDP2 data parallel of the torch trainer (training/data_parallel.py), 2 processes under gloo on CPU:
the same losses, grad norms and update as one process; forward-only passes split over the ranks and
gathered; a checkpoint written by the 2 ranks resumes them exactly and loads in one process."""

from __future__ import annotations

import dataclasses
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from miles_core import checkpoint as ckpt
from miles_core.training.batch import make_batch
from miles_core.training.data_parallel import split_rows
from miles_core.training.torch_trainer import TorchTrainer

sys.path.insert(0, str(Path(__file__).parent))  # the spawned ranks import _dp_ranks by this name
import _dp_ranks  # noqa: E402

from .conftest import make_cfg, make_samples, tiny_lm  # noqa: E402

# adam_eps 1: the update is ~linear in the gradient, so float-order differences stay ~1e-7 of it;
# 2 steps of 4 rows, micro-batches of 1: balanced shares of one step may be 1 and 3 rows (dummy passes)
DP = {"num_steps_per_rollout": 2, "micro_batch_size": 1, "adam_eps": 1.0, "balance_data": True,
      "use_kl_loss": True, "kl_loss_coef": 0.1}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[list[dict], Path]:
    """One 2-rank run (spawning the ranks costs most of the time), read by every test here: each rank's
    record (_dp_ranks.run_rank) and the save dir."""
    tmp = tmp_path_factory.mktemp("dp")
    out = tmp / "rank"
    mp.spawn(_dp_ranks.run_rank, args=(2, _port(), tiny_lm(seed=0), tiny_lm(seed=1), make_cfg(**DP), _samples(), str(out),
                                       str(tmp / "save")), nprocs=2, join=True)
    return [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)], tmp / "save"


def _samples():
    """8 samples (2 prompts x 4); sample 0's response 12 tokens longer, so the balanced shares of the first
    step are 1 and 3 rows (the rank with fewer micro-batches runs zero-weighted passes)."""
    samples = make_samples(seed=3)
    s = samples[0]
    extra = [5 + k for k in range(12)]
    samples[0] = dataclasses.replace(s, tokens=s.tokens + extra, response_length=s.response_length + 12,
                                     loss_mask=s.loss_mask + [1] * 12, rollout_log_probs=s.rollout_log_probs + [-3.0] * 12)
    return samples


def _close(a: float, b: float, rel: float = 1e-5, floor: float = 1e-7) -> bool:
    """Equal to ``rel`` of ``b``, or to ``floor`` where ``b`` is a small difference of O(1) terms (the loss: its
    fp32 sums in two ranks' order, not one process's, differ by ~3e-8 on some CPUs' vector widths)."""
    return abs(a - b) <= max(rel * abs(b), floor)


@pytest.fixture(scope="module")
def one_process() -> dict:
    """The same rollout trained by one process: weights before and after, the forward-only tensors, the
    step metrics and the optimizer state."""
    samples = _samples()
    one = TorchTrainer(tiny_lm(seed=0), make_cfg(**DP), pad_id=0, ref_model=tiny_lm(seed=1))
    before = {k: v.clone() for k, v in one.named_tensors()}
    batch = make_batch(samples, 0)
    old, ref = one.engine.compute_log_probs(one.engine.model, batch), one.engine.compute_log_probs(one.engine.ref_model, batch)
    steps = one.train_rollout(samples, [s.reward for s in samples], 0).steps
    return {"before": before, "old": old, "ref": ref, "steps": steps, "after": dict(one.named_tensors()),
            "optimizer": one.engine.optimizer.state_dict()["state"]}


def test_two_ranks_equal_one_process(two_ranks, one_process):
    lengths = make_batch(_samples(), 0).attention_mask.sum(-1).tolist()
    assert [len(s) for s in split_rows(range(4), lengths, 2, True)] == [1, 3]
    before, after, steps = one_process["before"], one_process["after"], one_process["steps"]
    ranks, _ = two_ranks
    for r in ranks:  # each rank gets the whole gathered tensors, equal to one process's
        assert (r["old"] - one_process["old"]).abs().max() < 1e-6 and (r["ref"] - one_process["ref"]).abs().max() < 1e-6
    for a, b in zip(ranks[0]["first"], steps):
        for key in ("train/loss", "train/pg_loss", "train/kl_loss", "train/grad_norm", "train/pg_clipfrac"):
            assert _close(a[key], b[key]), (key, a[key], b[key])
    for name, t in after.items():
        update = t - before[name]
        assert update.norm() > 0, name
        for r in ranks:
            assert (r["after1"][name] - before[name] - update).norm() <= 1e-3 * update.norm(), name
            assert torch.equal(r["after1"][name], ranks[0]["after1"][name])  # the replicas hold one model


def test_forward_only_passes_are_split_over_the_ranks(two_ranks):
    """N = 8 rows: each rank runs the old-policy and reference passes over its 4 rows only (in the first
    forward-only call, and again in each train_rollout), never over all 8."""
    ranks, _ = two_ranks
    for r in ranks:
        assert r["seen"] and all(rows == 4 for _, rows in r["seen"]), r["seen"]
        assert {kind for kind, _ in r["seen"]} == {"policy", "ref"}


def test_checkpoint_resumes_the_ranks_exactly_and_loads_in_one_process(two_ranks, one_process):
    """The 2 ranks save after rollout 0, offload and onload (offload_train), and train rollout 1; fresh ranks restore and
    train rollout 1 again:
    the same metrics and weights, bit for bit. The files hold full HF-named tensors and a plain
    torch.optim state (by parameter index), so one process loads them as its own."""
    ranks, save = two_ranks
    for r in ranks:
        assert r["meta"]["note"] == "dp" and r["meta"]["steps_done"] == 2
        assert r["parked"][0] == 0 < r["parked"][1]  # offload_train parked every shard; "second" trained after onload
        for a, b in zip(r["second"], r["again"]):
            assert a == b
        assert all(torch.equal(r["again_tensors"][k], v) for k, v in r["after2"].items())
    one = TorchTrainer(tiny_lm(seed=5), make_cfg(**DP), pad_id=0, ref_model=tiny_lm(seed=1))
    meta = ckpt.load_checkpoint(ckpt.find_latest(save), model=one.engine.model, optimizer=one.engine.optimizer)
    assert meta["steps_done"] == 2
    assert all(torch.equal(v, ranks[0]["after1"][k]) for k, v in one.engine.model.state_dict().items())
    loaded, mine = one.engine.optimizer.state_dict()["state"], one_process["optimizer"]
    assert sorted(loaded) == sorted(mine) == list(range(len(list(one.engine.model.parameters()))))
    for i, state in mine.items():  # the moments of the same 2 steps, up to float summation order
        for key in ("exp_avg", "exp_avg_sq"):
            assert (loaded[i][key] - state[key]).norm() <= 1e-4 * state[key].norm() + 1e-12, (i, key)
        assert float(loaded[i]["step"]) == float(state["step"]) == 2


# LoRA under FSDP2: the frozen base and the adapters sharded alike, AdamW over the adapters only
LORA_DP = {**DP, "use_kl_loss": False, "lora_rank": 4, "lora_alpha": 8, "target_modules": "all-linear", "lr": 1e-2}


def test_lora_on_two_ranks_equals_one_process_resumes_exactly_and_exports_the_adapter(tmp_path, tiny_tokenizer):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from miles_core.training.lora import AdapterView, adapters_of

    samples, cfg = _samples(), make_cfg(**LORA_DP)
    out = tmp_path / "rank"
    mp.spawn(_dp_ranks.run_rank, args=(2, _port(), tiny_lm(seed=0), None, cfg, samples, str(out), str(tmp_path / "save"),
                                       tiny_tokenizer), nprocs=2, join=True)
    ranks = [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]
    policy = tiny_lm(seed=0)
    torch.manual_seed(cfg.misc.seed)  # the adapters' init, as each rank drew it
    one = TorchTrainer(policy, cfg, pad_id=0, lora=adapters_of(cfg.lora))
    before = dict(one.named_tensors())
    steps = one.train_rollout(samples, [s.reward for s in samples], 0).steps
    after = dict(one.named_tensors())
    for a, b in zip(ranks[0]["first"], steps):
        for key in ("train/loss", "train/pg_loss", "train/grad_norm"):
            assert _close(a[key], b[key]), (key, a[key], b[key])
    moved = [n for n in after if not torch.equal(after[n], before[n])]
    assert moved and all(n.endswith("_proj.weight") for n in moved)  # the merged weights of adapted layers only
    for name in moved:
        update = after[name] - before[name]
        for r in ranks:
            assert (r["after1"][name] - before[name] - update).norm() <= 1e-3 * update.norm(), name
    for r in ranks:  # the checkpoint of the 2 ranks resumes them exactly
        assert all(a == b for a, b in zip(r["second"], r["again"]))
        assert all(torch.equal(r["again_tensors"][k], v) for k, v in r["after2"].items())
    fresh = TorchTrainer(tiny_lm(seed=0), cfg, pad_id=0, lora=adapters_of(cfg.lora))  # one process loads the ranks' checkpoint
    meta = ckpt.load_checkpoint(ckpt.find_latest(tmp_path / "save"), model=AdapterView(fresh.engine.model),
                                optimizer=fresh.engine.optimizer)
    assert meta["steps_done"] == 2 and all(torch.equal(v, ranks[0]["after1"][k]) for k, v in fresh.named_tensors())
    assert sorted(fresh.engine.optimizer.state_dict()["state"]) == list(range(len(fresh.engine.optimizer.param_groups[0]["params"])))
    export = tmp_path / "save-export" / "0"
    base = AutoModelForCausalLM.from_config(tiny_lm(seed=0).config)
    base.load_state_dict(tiny_lm(seed=0).state_dict())
    peft, merged = PeftModel.from_pretrained(base, export / "adapter"), AutoModelForCausalLM.from_pretrained(export)
    tokens = torch.tensor([samples[0].tokens])
    with torch.no_grad():
        assert (peft(tokens).logits - merged(tokens).logits).abs().max() < 1e-5
    assert all(torch.equal(merged.state_dict()[k], v) for k, v in ranks[0]["after1"].items() if k in merged.state_dict())

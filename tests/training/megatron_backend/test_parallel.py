"""Two processes under gloo: TP=2, PP=2 (tied embeddings) and EP=2 (MoE, with DP=2 for
the dense part) give the one-rank run's response log-probs, first step's loss and grad norm (1e-5) and
weight update; an HF -> torch_dist conversion written at TP=2 reads back at TP=1 bit-exactly."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from miles_core.training.batch import make_batch
from safetensors.torch import load_file

from miles_core.training.megatron.convert import torch_dist_to_hf
from miles_core.training.megatron.trainer import MegatronTrainer

from .conftest import VOCAB, hf_state, tiny_hf

sys.path.insert(0, str(Path(__file__).parent))  # the spawned ranks import _ranks by this name
import _ranks  # noqa: E402

MEGATRON = {"runtime": "ray", "train_backend": "megatron"}


def two_rank_cfg(cfg, sizes: dict):
    """The config each of the 2 ranks holds: the run's (validated, one rank) with the parallel sizes of the
    2-rank world set directly (config load refuses several Ray megatron ranks until the train group fans
    out weights and checkpoints to every rank; the trainer itself checks the sizes against its world)."""
    base = cfg(micro_batch_size=2, adam_eps=1.0, **MEGATRON)
    return base.model_copy(update={"parallel": base.parallel.model_copy(update=sizes)})


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# TP=2 runs an odd vocab (127): the Megatron model pads it to 128 (padded_vocab_size), masks the padded
# column out of the softmax, and the weights and the conversion come back at 127 rows.
@pytest.mark.parametrize("kind, tie, sizes, vocab", [
    ("qwen3", False, {"tensor_model_parallel_size": 2}, VOCAB - 1),
    ("qwen2", True, {"pipeline_model_parallel_size": 2}, VOCAB),
    ("glm4_moe", False, {"expert_model_parallel_size": 2}, VOCAB),
], ids=["tp2-odd-vocab", "pp2", "ep2"])
def test_two_ranks_equal_one(megatron_world, tmp_path, cfg, samples, kind, tie, sizes, vocab):
    tiny_hf(kind, tie=tie, vocab=vocab).save_pretrained(tmp_path / "hf")
    # adam_eps 1: the first update is ~linear in the gradient (tests/training/test_torch_trainer.py); with 1e-8 it is
    # lr * sign(g), and a weight whose gradient is ~0 takes either sign from float rounding (the packed thd layout
    # groups the rows differently on one rank and on two)
    one = MegatronTrainer(cfg(micro_batch_size=2, adam_eps=1.0), tmp_path / "hf", pad_id=0)
    before = dict(one.named_tensors())
    logp = one.engine.compute_log_probs(one.engine.model, make_batch(samples, 0))
    steps = one.train_rollout(samples, [s.reward for s in samples]).steps
    after = dict(one.named_tensors())

    out = tmp_path / "rank0.pt"
    convert_to = str(tmp_path / "td") if "tensor_model_parallel_size" in sizes else None
    mp.spawn(_ranks.run_rank, args=(2, _port(), two_rank_cfg(cfg, sizes), str(tmp_path / "hf"), samples, str(out),
                                    convert_to), nprocs=2, join=True)
    two = torch.load(out, weights_only=False)
    assert (two["logp"] - logp).abs().max() < 1e-5
    for key in ("train/loss", "train/pg_loss", "train/grad_norm"):
        assert two["steps"][0][key] == pytest.approx(steps[0][key], rel=1e-5, abs=1e-7), key
    for name, t in after.items():
        update = t - before[name]
        assert (two["tensors"][name] - before[name] - update).norm() <= 1e-3 * update.norm() + 1e-12, name
    if convert_to:
        torch_dist_to_hf(tmp_path / "td", tmp_path / "back")
        back = load_file(tmp_path / "back" / "model.safetensors")
        assert set(back) == set(hf_state(tiny_hf(kind, tie=tie, vocab=vocab))) and all(torch.equal(back[k], before[k]) for k in back)

"""megatron-core's distributed optimizer (use_distributed_optimizer) on 2 gloo ranks, DP=2, with the ppo critic:
the same loss, grad norms (1e-5) and weight update (1e-3 of its size) as torch's AdamW on every rank, each rank
holding half of the optimizer state; its torch_dist checkpoint resumes exactly."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from .test_parallel import _port, two_rank_cfg

sys.path.insert(0, str(Path(__file__).parent))  # the spawned ranks import _ranks by this name
import _ranks  # noqa: E402


def test_distributed_optimizer_equals_adamw_and_resumes_exactly(tmp_path, lm, cfg, samples):
    lm(seed=5).save_pretrained(tmp_path / "hf")
    ppo = lambda **kw: cfg(advantage_estimator="ppo", critic_lr=1e-2, lr=3e-3, **kw)  # noqa: E731
    cfgs = {"plain": two_rank_cfg(ppo, {}), "sharded": two_rank_cfg(ppo, {"use_distributed_optimizer": True})}
    out = tmp_path / "rank0.pt"
    mp.spawn(_ranks.run_distributed_optimizer, args=(2, _port(), cfgs, str(tmp_path / "hf"), samples, str(tmp_path / "ckpt"),
                                                     str(out)), nprocs=2, join=True)
    r = torch.load(out, weights_only=False)
    (plain, plain_after), (sharded, sharded_after) = r["plain"], r["sharded"]
    for key in ("train/loss", "train/pg_loss", "train/grad_norm", "train/critic-value_loss", "train/critic-grad_norm"):
        assert sharded[0][key] == pytest.approx(plain[0][key], rel=1e-5, abs=1e-7), key
    for name, t in plain_after.items():
        update = t - r["before"][name]
        assert update.norm() > 0 and (sharded_after[name] - t).norm() <= 1e-3 * update.norm(), name
    params = sum(t.numel() for name, t in r["before"].items() if name != "lm_head.weight")  # tied: the embedding once
    assert 0.9 * params < r["state_numel"] < 1.1 * params  # rank 0's policy AdamW state: 2 moments of half the parameters

    (second, second_after), (resumed, resumed_after) = r["second"], r["resumed"]
    assert r["meta"]["data_source"] == {"offset": 8} and resumed == second and second != sharded
    assert all(torch.equal(resumed_after[k], v) for k, v in second_after.items())
    assert (tmp_path / "ckpt" / "0" / "torch_dist").is_dir()


def test_one_rank_equals_adamw_and_a_checkpoint_of_the_other_optimizer_is_refused(megatron_world, tmp_path, lm, cfg, samples):
    from miles_core.training.megatron.trainer import MegatronTrainer

    lm(seed=6).save_pretrained(tmp_path / "hf")
    rewards = [s.reward for s in samples]
    sharded_cfg = two_rank_cfg(cfg, {"use_distributed_optimizer": True})
    sharded = MegatronTrainer(sharded_cfg, tmp_path / "hf", pad_id=0)
    plain = MegatronTrainer(two_rank_cfg(cfg, {}), tmp_path / "hf", pad_id=0)
    ours, theirs = sharded.train_rollout(samples, rewards).steps[0], plain.train_rollout(samples, rewards).steps[0]
    assert ours["train/grad_norm"] == pytest.approx(theirs["train/grad_norm"], rel=1e-5)
    sharded.save(tmp_path / "ckpt", 0, {})
    with pytest.raises(ValueError, match="use_distributed_optimizer true, this run sets it false"):
        plain.restore(tmp_path / "ckpt")
    assert MegatronTrainer(sharded_cfg, tmp_path / "hf", pad_id=0).restore(tmp_path / "ckpt")["rollout_id"] == 0

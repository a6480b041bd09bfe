"""Two Ray train workers (gloo, data parallel) take the same step as one process."""

from __future__ import annotations

import os

import pytest
import torch

from flows.recipes import load_config
from tests.training._samples import uneven_samples as _samples

pytestmark = pytest.mark.usefixtures("local_ray")


# adam_eps 1: the update is ~linear in the gradient (see tests/training/test_torch_trainer.py); 2 steps per rollout
TWO_RANKS = {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "num_steps_per_rollout": 2, "lr": 1e-3, "adam_eps": 1.0,
             "micro_batch_size": 1, "actor_num_gpus_per_node": 2, "rollout_num_gpus": 1, "balance_data": True}
REWARDS = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]


def _ask(worker, name: str):
    """Each rank's own answer: a Trainer protocol member through the worker's ``call``, else a worker method."""
    from miles_core.training.protocol import Trainer

    return worker.call.remote(getattr(Trainer, name).__name__) if hasattr(Trainer, name) else getattr(worker, name).remote()


def _train_on_two_ranks(cfg, model_dir, samples, rewards, *fetch: str):
    """One train_rollout on a 2-rank TrainGroup; -> (its result, [each rank's answer to each method in fetch])."""
    import ray

    from miles_core.runtime.ray.placement import create_placement_group, plan_placement
    from miles_core.runtime.ray.train_group import TrainGroup

    plan = plan_placement(cfg.cluster, use_gpu=False)
    pg = create_placement_group(plan)
    group = TrainGroup(cfg, str(model_dir), pg, plan.train_bundles, plan.actor_resources(), "gloo")
    try:
        result = group.train_rollout(samples, rewards, 0)
        answers = [ray.get([_ask(w, name) for w in group.workers]) for name in fetch]
        env = ray.get([w.__ray_call__.remote(lambda _: {k: os.environ.get(k) for k in (*cfg.cluster.train_env_vars, "MILES_CACHE_DIR")})
                       for w in group.workers])  # each rank's process environment
        return result, answers + [env]
    finally:
        group.shutdown()
        ray.util.remove_placement_group(pg)


@pytest.mark.parametrize("balance", [True])  # contiguous shares: the same code path with another split
def test_two_ranks_equal_one_process(tiny_model_dir, tiny_tokenizer, balance):
    from miles_core.training.backends import build_torch_trainer
    from miles_core.training.protocol import TrainerContext

    # train_env_vars (the reference's --train-env-vars) reaches every rank's process, over the inherited environment
    cfg = load_config("tiny", {**TWO_RANKS, "balance_data": balance, "runtime": "ray",
                               "train_env_vars": {"MILES_TRAIN_ENV_TEST": "on"}})
    samples, rewards = _samples(tiny_tokenizer), REWARDS

    one = build_torch_trainer(TrainerContext(cfg=cfg, model_path=tiny_model_dir, tokenizer=tiny_tokenizer))
    flat = lambda: torch.cat([t.detach().flatten().clone() for _, t in one.named_tensors()])  # noqa: E731
    w0 = flat()
    out1 = one.train_rollout(samples, rewards)
    roll1, steps1 = out1.rollout, out1.steps
    w1 = flat()

    out2, (ranks, env) = _train_on_two_ranks(cfg, tiny_model_dir, samples, rewards, "named_tensors")
    assert env == [{"MILES_TRAIN_ENV_TEST": "on", "MILES_CACHE_DIR": os.environ.get("MILES_CACHE_DIR")}] * 2
    w_ranks = [torch.cat([t.flatten() for _, t in named]) for named in ranks]
    moved = (w1 - w0).abs().max()
    assert moved > 1e-6
    assert torch.equal(w_ranks[0], w_ranks[1])  # the replicas apply the same update
    assert (w_ranks[0] - w1).abs().max() < 1e-3 * moved, ((w_ranks[0] - w1).abs().max(), moved)
    roll2, steps2 = out2.rollout, out2.steps
    assert len(steps2) == 2
    for a, b in zip(steps1, steps2):
        for key in ("train/loss", "train/pg_loss", "train/entropy_loss", "train/grad_norm", "train/pg_clipfrac"):
            assert abs(a[key] - b[key]) < 1e-5 * max(1.0, abs(a[key])), (key, a[key], b[key])
    assert abs(roll1["rollout/advantages"] - roll2["rollout/advantages"]) < 1e-6


def test_ppo_critic_two_ranks_equal_one_process(tiny_model_dir, tiny_tokenizer):
    """ppo: the critic trains data-parallel too (its share of rows per rank, gradients summed): policy
    and critic weights and the value metrics of 2 ranks equal one process's."""
    from miles_core.training.backends import build_torch_trainer
    from miles_core.training.protocol import TrainerContext

    cfg = load_config("tiny", {**TWO_RANKS, "advantage_estimator": "ppo", "normalize_advantages": True})
    samples, rewards = _samples(tiny_tokenizer), REWARDS

    one = build_torch_trainer(TrainerContext(cfg=cfg, model_path=tiny_model_dir, tokenizer=tiny_tokenizer))
    flat = lambda named: torch.cat([t.detach().flatten().clone() for _, t in named])  # noqa: E731
    c0 = flat(one.engine.critic.module.state_dict().items())
    steps1 = one.train_rollout(samples, rewards, 0).steps
    w1, c1 = flat(one.named_tensors()), flat(one.engine.critic.module.state_dict().items())

    out2, (ranks, critics, _) = _train_on_two_ranks(cfg, tiny_model_dir, samples, rewards, "named_tensors", "extra_tensors")
    steps2 = out2.steps
    moved = (c1 - c0).abs().max()
    assert moved > 1e-6
    c_ranks = [flat(c["critic"]) for c in critics]
    assert torch.equal(c_ranks[0], c_ranks[1])
    assert (c_ranks[0] - c1).abs().max() < 1e-3 * moved, ((c_ranks[0] - c1).abs().max(), moved)
    assert (flat(ranks[0]) - w1).abs().max() < 1e-5
    for a, b in zip(steps1, steps2):
        for key in ("train/critic-value_loss", "train/critic-value_clipfrac", "train/critic-grad_norm", "train/critic-lr-pg_0"):
            assert abs(a[key] - b[key]) < 1e-5 * max(1.0, abs(a[key])), (key, a[key], b[key])


def test_a_build_that_fails_frees_its_placement(tmp_path, tiny_model_dir):
    """A rank that cannot start (here: a model dir without its weights) fails the build, and nothing stays
    placed: the prepare task's retry can place the same group again instead of waiting for bundles that never free."""
    import shutil
    import types

    import ray

    from miles_core.runtime.ray.cluster import build_ray

    broken = tmp_path / "no-weights"
    shutil.copytree(tiny_model_dir, broken, ignore=shutil.ignore_patterns("*.safetensors"))
    cfg = load_config("tiny", {"runtime": "ray", "actor_num_gpus_per_node": 2, "rollout_num_gpus": 1, "run_dir": str(tmp_path / "run")})
    before = set(ray.util.placement_group_table())
    with pytest.raises(Exception, match="no-weights|safetensors|model"):
        build_ray(cfg, types.SimpleNamespace(model_path=broken))
    table = ray.util.placement_group_table()
    assert [table[k]["state"] for k in set(table) - before] == ["REMOVED"]


def test_device_cuda_on_a_cluster_without_gpus_fails_before_anything_is_placed(tmp_path):
    """wants_gpu reads the Ray cluster's GPUs: device cuda needs some (else a named error before any bundle),
    auto reserves them when there are any, cpu never."""
    import ray

    from miles_core.preflight import PreflightError
    from miles_core.runtime.ray.cluster import wants_gpu

    gpus = ray.cluster_resources().get("GPU", 0)
    cfg = {device: load_config("tiny", {"runtime": "ray", "device": device, "run_dir": str(tmp_path)}) for device in ("cpu", "auto", "cuda")}
    assert not wants_gpu(cfg["cpu"]) and wants_gpu(cfg["auto"]) == (gpus > 0)
    if gpus:
        assert wants_gpu(cfg["cuda"])
    else:
        with pytest.raises(PreflightError, match=r"device: cuda, but the Ray cluster \(local\) has no GPU"):
            wants_gpu(cfg["cuda"])


def test_the_call_tables_name_every_protocol_member_once():
    """TRAINER_CALLS / SENDER_CALLS declare where each member of the Trainer protocol and of WeightSender runs; a
    member added or renamed there without a row here fails this test (a renamed one already fails the import)."""
    from miles_core.runtime.ray.train_group import EVERY, LEAD, RANK0, SENDER_CALLS, TRAINER_CALLS, RankZeroSender, TrainGroup
    from miles_core.training.protocol import Trainer
    from miles_core.weights.sync import WeightSender

    for protocol, table, proxy in ((Trainer, TRAINER_CALLS, TrainGroup), (WeightSender, SENDER_CALLS, RankZeroSender)):
        members = {n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")}
        assert sorted(m.__name__ for m in table) == sorted(members)
        assert all(getattr(protocol, m.__name__) is m for m in table)
        assert set(table.values()) <= {EVERY, LEAD, RANK0}
        assert all(callable(getattr(proxy, name)) for name in members)
    assert TRAINER_CALLS[Trainer.train_rollout] == EVERY and SENDER_CALLS[WeightSender.master_address] == RANK0

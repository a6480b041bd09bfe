"""The body of one rank of a 2-process gloo world (tests/training/megatron_backend/test_parallel.py):
train one rollout with the Megatron trainer and write what rank 0 sees."""

from __future__ import annotations


def run_rank(rank: int, world: int, port: int, cfg, model_dir: str, samples, out: str, convert_to: str | None = None) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from miles_core.training.batch import make_batch
    from miles_core.training.megatron.parallel import from_last_stage as _from_last_stage
    from miles_core.training.megatron.trainer import MegatronTrainer

    trainer = MegatronTrainer(cfg, model_dir, pad_id=0)
    if convert_to:  # HF -> torch_dist at this world's parallel layout
        from miles_core.training.megatron.convert import hf_to_torch_dist

        hf_to_torch_dist(model_dir, convert_to)
    logp = _from_last_stage(trainer.engine.compute_log_probs(trainer.engine.model, make_batch(samples, 0)))
    result = trainer.train_rollout(samples, [s.reward for s in samples])
    tensors = dict(trainer.named_tensors())
    if rank == 0:
        torch.save({"logp": logp, "steps": result.steps, "tensors": tensors}, out)
    trainer.close()


def run_configs(rank: int, world: int, port: int, cfgs: dict, model_dir: str, samples, out: str) -> None:
    """One rollout per config of ``cfgs`` (name -> config), each on a fresh trainer; rank 0 writes {name: what it saw}."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from miles_core.training.batch import make_batch
    from miles_core.training.megatron.parallel import from_last_stage
    from miles_core.training.megatron.trainer import MegatronTrainer

    seen = {}
    for name, cfg in cfgs.items():
        trainer = MegatronTrainer(cfg, model_dir, pad_id=0)
        logp = from_last_stage(trainer.engine.compute_log_probs(trainer.engine.model, make_batch(samples, 0)))
        steps = trainer.train_rollout(samples, [s.reward for s in samples]).steps
        seen[name] = {"logp": logp, "steps": steps, "tensors": dict(trainer.named_tensors())}
        trainer.close()
    if rank == 0:
        torch.save(seen, out)


def run_distributed_optimizer(rank: int, world: int, port: int, cfgs: dict, model_dir: str, samples, ckpt: str, out: str) -> None:
    """DP=2: a rollout with torch's AdamW ("plain"), then with megatron's distributed optimizer ("sharded"), which saves
    a torch_dist checkpoint and trains a second rollout; a fresh trainer ("resumed") restores it and trains that rollout."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from miles_core.training.megatron.trainer import MegatronTrainer

    rewards = [s.reward for s in samples]
    result = {}
    plain = MegatronTrainer(cfgs["plain"], model_dir, pad_id=0)
    result["before"] = dict(plain.named_tensors())
    result["plain"] = plain.train_rollout(samples, rewards, 0).steps, dict(plain.named_tensors())
    plain.close()
    sharded = MegatronTrainer(cfgs["sharded"], model_dir, pad_id=0)
    result["sharded"] = sharded.train_rollout(samples, rewards, 0).steps, dict(sharded.named_tensors())
    result["state_numel"] = sum(t.numel() for s in sharded.engine.optimizer.optimizer.state.values() for t in s.values() if t.dim())
    sharded.save(ckpt, 0, {"data_source": {"offset": 8}})
    result["second"] = sharded.train_rollout(samples, rewards, 1).steps, dict(sharded.named_tensors())
    sharded.close()
    resumed = MegatronTrainer(cfgs["sharded"], model_dir, pad_id=0)
    result["meta"] = resumed.restore(ckpt)
    result["resumed"] = resumed.train_rollout(samples, rewards, 1).steps, dict(resumed.named_tensors())
    resumed.close()
    if rank == 0:
        torch.save(result, out)

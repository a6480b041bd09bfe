"""The body of one rank of a 2-process gloo world (tests/training/test_data_parallel.py): the torch trainer
with FSDP2 data parallel trains one rollout, saves, offloads and onloads its state, trains a second; a fresh trainer restores the
checkpoint and trains the second again. Each rank writes what it saw to <out>.<rank>."""

from __future__ import annotations

import copy


def build(rank: int, world: int, policy, ref, cfg, pad_id: int):
    """The trainer of one rank; with lora_rank > 0 the adapters drawn from torch's RNG seeded by cfg's seed (every rank
    and the one-process peer draw the same)."""
    import torch

    from miles_core.training.data_parallel import FSDPDataParallel
    from miles_core.training.lora import adapters_of
    from miles_core.training.torch_trainer import TorchTrainer

    if cfg.lora.enabled:
        torch.manual_seed(cfg.misc.seed)
    return TorchTrainer(copy.deepcopy(policy), cfg, pad_id=pad_id, ref_model=None if ref is None else copy.deepcopy(ref),
                        parallel=FSDPDataParallel(rank, world, cfg.cluster.balance_data), lora=adapters_of(cfg.lora))


def run_rank(rank: int, world: int, port: int, policy, ref, cfg, samples, out: str, save_dir: str, tokenizer=None) -> None:
    """``tokenizer``: also export after the first rollout, into <save_dir>-export."""
    import torch
    import torch.distributed as dist

    from miles_core.training.batch import make_batch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        trainer = build(rank, world, policy, ref, cfg, pad_id=0)
        seen: list[tuple[str, int]] = []  # (which model, rows) of every forward-only pass of this rank
        inner = trainer.engine.compute_log_probs

        def counting(model, batch):
            seen.append(("policy" if model is trainer.engine.model else "ref", len(batch)))
            return inner(model, batch)

        trainer.engine.compute_log_probs = counting
        rewards = [s.reward for s in samples]
        tensors = trainer.forward_passes(make_batch(samples, 0), samples)
        first = trainer.train_rollout(samples, rewards, 0)
        after1 = dict(trainer.named_tensors())
        trainer.save(save_dir, 0, {"note": "dp"})
        if tokenizer is not None:
            trainer.engine.export(f"{save_dir}-export", 0, tokenizer)
        trainer.offload()  # offload_train's round trip of the FSDP2 shards before rollout 1: it must change nothing
        parked = trainer.where()
        trainer.onload()
        second = trainer.train_rollout(samples, rewards, 1)
        after2 = dict(trainer.named_tensors())
        resumed = build(rank, world, policy, ref, cfg, pad_id=0)
        meta = resumed.restore(save_dir)
        again = resumed.train_rollout(samples, rewards, 1)
        torch.save({"seen": seen, "old": tensors.old, "ref": tensors.ref, "first": first.steps, "second": second.steps,
                    "again": again.steps, "after1": after1, "after2": after2, "again_tensors": dict(resumed.named_tensors()),
                    "meta": meta, "parked": (parked.device_bytes, parked.host_bytes)}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()

"""TrainGroup: N TrainWorker actors running the torch trainer data-parallel over a gloo group.

Every rank receives the whole rollout and computes the forward-only passes and advantages on all
of it (so advantages, group statistics and the Reducer's global denominators are exactly those of
one process). Each optimizer step then runs forward/backward on this rank's share of the global
batch only, and the gradients and metric totals are summed over ranks (one all-reduce) before
clipping and the optimizer step: every rank applies the same update, so the replicas stay equal.
The redundant forward-only passes cost N_ranks x; sharding them (and all-gathering) is left to do.

Shares: ``balance_data`` splits the rows of a global batch by token count (longest first onto the
lightest rank), else in contiguous blocks. Rows are sorted within a rank (micro-batches keep order).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import torch

from miles_core.config import TrainConfig
from miles_core.weights.sync import WeightSender


def split_rows(rows: range, lengths: list[int], world: int, balance: bool) -> list[list[int]]:
    """rows of a global batch -> one sorted list per rank. balance: greedy by length (longest first,
    lightest rank; ties: lower rank), else contiguous blocks (sizes differ by at most one)."""
    rows = list(rows)
    if not balance:
        q, r = divmod(len(rows), world)
        starts = [k * q + min(k, r) for k in range(world + 1)]
        return [rows[starts[k] : starts[k + 1]] for k in range(world)]
    shares: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in sorted(rows, key=lambda i: (-lengths[i], i)):
        k = min(range(world), key=lambda k: (load[k], len(shares[k]), k))
        shares[k].append(i)
        load[k] += lengths[i]
    return [sorted(s) for s in shares]


@dataclass
class GlooDataParallel:
    """The trainer's ``dp`` hook (TorchTrainer._actor_step)."""

    rank: int
    world: int
    balance: bool

    def shard(self, batch, rows: range) -> list[int]:
        lengths = batch.attention_mask.sum(-1).tolist()
        return split_rows(rows, lengths, self.world, self.balance)[self.rank]

    def all_reduce(self, model: torch.nn.Module, metrics: dict[str, float]) -> dict[str, float]:
        import torch.distributed as dist

        params = [p for p in model.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        names = sorted(metrics)
        flat = torch.cat([g.reshape(-1) for g in grads] + [torch.tensor([metrics[k] for k in names], dtype=grads[0].dtype)])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p, g in zip(params, grads):
            p.grad = flat[offset : offset + g.numel()].view_as(g).clone()
            offset += g.numel()
        return {k: float(v) for k, v in zip(names, flat[offset:])}


def free_address() -> str:
    host = socket.gethostbyname(socket.gethostname())
    with socket.socket() as s:
        s.bind(("", 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


def build_trainer(cfg: TrainConfig, model_path: str, tokenizer):
    """The policy (seeded), reference and teacher models and the TorchTrainer, as LocalRuntime builds them."""
    from transformers import AutoModelForCausalLM

    from miles_core.env import cache_dir
    from miles_core.models import resolve_model_path
    from miles_core.rollout.hf_engine import HFEngine
    from miles_core.training.teacher import load_teacher
    from miles_core.training.torch_trainer import TorchTrainer

    torch.manual_seed(cfg.misc.seed)
    dtype = getattr(torch, cfg.misc.dtype)
    policy = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    ref = None
    if cfg.needs_ref_model:
        ref_path = resolve_model_path(cfg.checkpoint.ref_load, cache_dir()) if cfg.checkpoint.ref_load else model_path
        ref = AutoModelForCausalLM.from_pretrained(ref_path, dtype=dtype).eval()
    teacher = load_teacher(cfg, dtype, policy.config.vocab_size, make_engine=lambda m: HFEngine(m, tokenizer))
    return TorchTrainer(policy, cfg, pad_id=tokenizer.pad_token_id, ref_model=ref, teacher=teacher)


class TrainWorker:
    """One rank (a Ray actor; plain class so tests may also build it in process)."""

    def __init__(self, cfg: TrainConfig, model_path: str, rank: int, world: int, num_threads: int | None = None):
        from transformers import AutoTokenizer

        if num_threads:
            torch.set_num_threads(num_threads)
        self.cfg, self.rank, self.world = cfg, rank, world
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.trainer = build_trainer(cfg, model_path, self.tokenizer)
        self.sender = WeightSender(self.trainer.named_tensors, self.trainer.model.config)

    def address(self) -> str:
        return free_address()

    def init_group(self, address: str) -> int:
        import torch.distributed as dist

        if self.world > 1:
            dist.init_process_group("gloo", init_method=address, rank=self.rank, world_size=self.world)
            self.trainer.dp = GlooDataParallel(self.rank, self.world, self.cfg.cluster.balance_data)
        return self.rank

    def train_rollout(self, samples, rewards, rollout_id):
        return self.trainer.train_rollout(samples, rewards, rollout_id)

    def named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        return [(k, v.detach().clone()) for k, v in self.trainer.named_tensors()]

    # ---- weight sync: the WeightSender of this rank (RankZeroSender calls these on rank 0) ----------------
    def weight_tensors(self):
        return self.sender.tensors()

    def weight_meta(self):
        return self.sender.meta()

    def weight_master_address(self):
        return self.sender.master_address()

    def init_weight_broadcast(self, host: str, port: int, world_size: int, backend: str) -> None:
        self.sender.init_broadcast(host, port, world_size, backend)

    def broadcast_weights(self, names: list[str]) -> None:
        self.sender.broadcast(names)

    def save_weights(self, path: str) -> str:
        return self.sender.save(path)

    def extra_tensors(self) -> dict[str, list[tuple[str, torch.Tensor]]]:
        """The critic's (ppo) tensors, by module name, as named_tensors gives the policy's."""
        return {k: [(n, t.detach().clone()) for n, t in m.state_dict().items()] for k, m in self.trainer.extra_modules().items()}

    def mean_log_probs(self, samples) -> list[float]:
        """Per sample: the mean log-prob of its response tokens under this rank's policy now (tests, diagnostics)."""
        from miles_core.training.batch import make_batch

        batch = make_batch(samples, self.trainer.pad_id)
        logp = self.trainer.compute_log_probs(self.trainer.model, batch)  # [N, T]
        mask = batch.loss_mask.float()
        return ((logp * mask).sum(-1) / mask.sum(-1).clamp(min=1)).tolist()

    def steps_done(self) -> int:
        return self.trainer.steps_done

    def save(self, rollout_id: int, state: dict) -> None:
        from miles_core import checkpoint as ckpt

        c = self.cfg.checkpoint
        ckpt.save_checkpoint(self.cfg.save_dir, rollout_id, model=self.trainer.model, optimizer=self.trainer.optimizer,
                             state={**state, "steps_done": self.trainer.steps_done}, keep_last=c.keep_last, save_optim=not c.no_save_optim,
                             extra_tensors=self.trainer.extra_modules() or None)

    def restore(self) -> dict | None:
        from miles_core import checkpoint as ckpt

        info = ckpt.find_latest(self.cfg.load_dir)
        if info is None:
            return None
        meta = ckpt.load_checkpoint(info, model=self.trainer.model, optimizer=self.trainer.optimizer,
                                    extra_modules=self.trainer.extra_modules() or None)
        self.trainer.steps_done = meta["steps_done"]
        return meta

    def export(self, rollout_id: int) -> str:
        from miles_core import checkpoint as ckpt

        return str(ckpt.export_hf(self.trainer.model, self.tokenizer, self.cfg.export_dir, rollout_id))


class TrainGroup:
    """The N workers; rank 0 is the source of weights, checkpoints and exports."""

    def __init__(self, cfg: TrainConfig, model_path: str, pg, bundles: list[int], resources: dict[str, float]):
        import ray

        from .placement import in_bundle

        world = len(bundles)
        threads = cfg.cluster.num_threads or 1
        cls = ray.remote(TrainWorker)
        self.workers = [cls.options(**resources, **in_bundle(pg, b)).remote(cfg, model_path, r, world, threads)
                        for r, b in enumerate(bundles)]
        address = ray.get(self.workers[0].address.remote())
        ray.get([w.init_group.remote(address) for w in self.workers])

    def call(self, method: str, *args):
        """method(*args) on every rank. -> rank 0's answer."""
        import ray

        return ray.get([getattr(w, method).remote(*args) for w in self.workers])[0]

    def rank0(self, method: str, *args):
        import ray

        return ray.get(getattr(self.workers[0], method).remote(*args))

    def shutdown(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)


class RankZeroSender:
    """WeightSender's interface, served by train rank 0 (the bytes of broadcast and disk modes never
    pass through the driver; tensor mode fetches them through the object store)."""

    def __init__(self, worker):
        self.worker = worker

    def _call(self, method: str, *args):
        import ray

        return ray.get(getattr(self.worker, method).remote(*args))

    def tensors(self):
        return self._call("weight_tensors")

    def meta(self):
        return self._call("weight_meta")

    def master_address(self):
        return self._call("weight_master_address")

    def init_broadcast(self, host: str, port: int, world_size: int, backend: str) -> None:
        self._call("init_weight_broadcast", host, port, world_size, backend)

    def broadcast(self, names: list[str]) -> None:
        self._call("broadcast_weights", names)

    def save(self, path: str) -> str:
        return self._call("save_weights", path)

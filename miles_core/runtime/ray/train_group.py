"""TrainGroup: N TrainWorker actors, one trainer rank each, as one Trainer (training/protocol.py).

Each worker builds the backend ``train_backend`` names (training/backends.py) with its rank and the
world size, after joining a torch.distributed group (gloo on CPU, NCCL on GPU): the torch trainer
runs data parallel over it (training/data_parallel.py), megatron its TP x PP x CP x DP ranks.

Where each call runs is declared once, per protocol member, in TRAINER_CALLS (the Trainer protocol) and
SENDER_CALLS (WeightSender, served by train rank 0 for weight syncs):
    EVERY  every rank (a collective: train, restore, offload); rank 0's answer
    LEAD   rank 0; every rank when the trainer is ``collective`` (the others take part in the gather)
    RANK0  rank 0 alone
The tables are keyed by the protocol's members themselves (``Trainer.train_rollout``), so a rename fails at
import, and tests/runtime/test_train_group.py holds them equal to the protocols' member lists. ``RankGroup``
runs a member on its ranks; TrainGroup and RankZeroSender are built from the tables (``proxy``).
"""

from __future__ import annotations

import datetime
import socket
from pathlib import Path
from typing import Callable

import torch

from miles_core.config import TrainConfig
from miles_core.device import resolve_device
from miles_core.malloc import retain_freed_memory
from miles_core.training.protocol import Trainer, TrainerContext
from miles_core.weights.sync import WeightSender, host_copy, node_address

EVERY, LEAD, RANK0 = "every rank", "lead", "rank 0"

TRAINER_CALLS: dict[Callable, str] = {
    Trainer.train_rollout: EVERY, Trainer.restore: EVERY, Trainer.offload: EVERY, Trainer.onload: EVERY,
    Trainer.named_tensors: LEAD, Trainer.mean_log_probs: LEAD, Trainer.save: LEAD, Trainer.export: LEAD,
    Trainer.hf_config: RANK0, Trainer.run_params: RANK0, Trainer.where: RANK0,
    Trainer.wait_saves: RANK0,  # async_save: rank 0 writes the checkpoints
}
SENDER_CALLS: dict[Callable, str] = {
    WeightSender.tensors: LEAD, WeightSender.meta: LEAD, WeightSender.broadcast: LEAD, WeightSender.save: LEAD,  # read named_tensors
    WeightSender.publish_delta: LEAD, WeightSender.checksums: LEAD,
    WeightSender.adapter: LEAD, WeightSender.save_adapter: LEAD,  # read adapter_tensors
    WeightSender.master_address: RANK0, WeightSender.init_broadcast: RANK0,
}


def to_host(obj):
    """An answer as it crosses to the driver: tensors copied to the CPU (the driver may see no GPU), in lists and tuples."""
    if isinstance(obj, torch.Tensor):
        return host_copy(obj)
    if isinstance(obj, list):
        return [to_host(x) for x in obj]
    if type(obj) is tuple:
        return tuple(to_host(x) for x in obj)
    return obj


def free_address() -> str:
    """rank 0's rendezvous: the address its Ray node reports (a host name may resolve to a loopback), a free port."""
    host = node_address()
    with socket.socket() as s:
        s.bind(("", 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


class TrainWorker:
    """One rank (a Ray actor; plain class so tests may also build it in process)."""

    def __init__(self, cfg: TrainConfig, model_path: str, rank: int, world: int, num_threads: int | None = None):
        from transformers import AutoTokenizer

        if num_threads:
            torch.set_num_threads(num_threads)
        if resolve_device(cfg.cluster.device).type == "cpu":
            retain_freed_memory()  # miles_core/malloc.py
        self.cfg, self.rank, self.world, self.model_path = cfg, rank, world, model_path
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.trainer = self.sender = None

    def address(self) -> str:
        return free_address()

    def start(self, address: str, backend: str) -> int:
        """Join the train group's process group, then build this rank's trainer."""
        import torch.distributed as dist

        from miles_core.training.backends import TRAINERS

        if self.world > 1:
            minutes = self.cfg.parallel.distributed_timeout_minutes if self.cfg.cluster.train_backend == "megatron" else None
            timeout = {"timeout": datetime.timedelta(minutes=minutes)} if minutes else {}  # torch: its own default
            dist.init_process_group(backend, init_method=address, rank=self.rank, world_size=self.world, **timeout)
        ctx = TrainerContext(cfg=self.cfg, model_path=Path(self.model_path), tokenizer=self.tokenizer, rank=self.rank,
                             world_size=self.world)
        self.trainer = TRAINERS[self.cfg.cluster.train_backend](ctx)
        self.sender = WeightSender(self.trainer.named_tensors, self.trainer.hf_config(), adapter=self.trainer.adapter_tensors)
        return self.rank

    def collective(self) -> bool:
        return getattr(self.trainer, "collective", False)

    def call(self, name: str, *args):
        """trainer.<name>(*args): a member of the Trainer protocol (TRAINER_CALLS) on this rank."""
        return to_host(getattr(self.trainer, name)(*args))

    def send(self, name: str, *args):
        """sender.<name>(*args) (SENDER_CALLS) on rank 0. The other ranks are called only with a collective trainer,
        for the members that read the weights: they take part in gathering them (named_tensors), and send nothing."""
        if self.rank == 0:
            return getattr(self.sender, name)(*args)
        adapter = name in (WeightSender.adapter.__name__, WeightSender.save_adapter.__name__)
        gather = self.trainer.adapter_tensors if adapter else self.trainer.named_tensors
        gather()
        return None

    def extra_tensors(self) -> dict[str, list[tuple[str, torch.Tensor]]]:
        """The critic's (ppo) tensors, by module name, as named_tensors gives the policy's (tests)."""
        return {k: [(n, host_copy(t)) for n, t in m.state_dict().items()] for k, m in self.trainer.engine.extra_modules().items()}


class RankGroup:
    """The workers' ranks; ``run`` sends one protocol member to the ranks its table says (module docstring)."""

    def __init__(self, workers: list, calls: dict[Callable, str], via: str):
        self.workers, self.calls, self.via = workers, calls, via  # via: the worker method (call, send)
        self.collective = False  # set once the trainer is built

    def ranks(self, member: Callable) -> list:
        where = self.calls[member]
        return self.workers if where == EVERY or (where == LEAD and self.collective) else self.workers[:1]

    def run(self, member: Callable, *args):
        """member(*args) on its ranks -> rank 0's answer."""
        import ray

        return ray.get([getattr(w, self.via).remote(member.__name__, *args) for w in self.ranks(member)])[0]


def proxy(member: Callable):
    """A method that runs the protocol member ``member`` on the object's rank group (``self.ranks``)."""
    def call(self, *args):
        return self.ranks.run(member, *args)

    call.__name__, call.__qualname__, call.__doc__ = member.__name__, member.__qualname__, member.__doc__
    return call


class TrainGroup:
    """The N workers as one Trainer; rank 0 is the source of weights, checkpoints and exports. Every protocol
    member is a ``proxy`` (TRAINER_CALLS); train_rollout, restore and hf_config add the group's own bookkeeping."""

    def __init__(self, cfg: TrainConfig, model_path: str, pg, bundles: list[int], resources: dict[str, float], backend: str):
        import ray

        from .placement import in_bundle

        world = len(bundles)
        threads = cfg.cluster.num_threads or 1
        cls = ray.remote(TrainWorker)
        env = {"env_vars": dict(cfg.cluster.train_env_vars)}  # merged by Ray over the job's env_vars (session.py)
        self.workers = [cls.options(**resources, **in_bundle(pg, b), runtime_env=env).remote(cfg, model_path, r, world, threads)
                        for r, b in enumerate(bundles)]
        self.ranks = RankGroup(self.workers, TRAINER_CALLS, "call")
        try:
            address = ray.get(self.workers[0].address.remote())
            ray.get([w.start.remote(address, backend) for w in self.workers])
            self._hf_config = self.ranks.run(Trainer.hf_config)
            self.collective = self.ranks.collective = ray.get(self.workers[0].collective.remote())
        except BaseException:
            self.shutdown()  # a rank that failed to start frees its bundle: a retried prepare can place the group again
            raise
        self.steps_done = 0  # a fresh trainer on every rank; restore() sets it from the checkpoint

    def train_rollout(self, samples, rewards, rollout_id: int):
        out = self.ranks.run(Trainer.train_rollout, samples, rewards, rollout_id)
        self.steps_done += len(out.steps)
        return out

    def restore(self, load_dir: Path) -> dict | None:
        meta = self.ranks.run(Trainer.restore, load_dir)
        if meta is not None:
            self.steps_done = meta["steps_done"]
        return meta

    def hf_config(self):
        return self._hf_config

    def shutdown(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)


class RankZeroSender:
    """WeightSender's interface, served by train rank 0 (the bytes of broadcast and disk modes never pass through
    the driver; tensor mode fetches them through the object store); every member a ``proxy`` (SENDER_CALLS)."""

    def __init__(self, group: TrainGroup):
        self.ranks = RankGroup(group.workers, SENDER_CALLS, "send")
        self.ranks.collective = group.collective


def _proxies(cls, calls: dict[Callable, str]) -> None:
    for member in calls:
        if member.__name__ not in cls.__dict__:
            setattr(cls, member.__name__, proxy(member))


_proxies(TrainGroup, TRAINER_CALLS)
_proxies(RankZeroSender, SENDER_CALLS)

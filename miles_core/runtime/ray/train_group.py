"""TrainGroup: N TrainWorker actors, one trainer rank each, as one Trainer (training/protocol.py).

Each worker builds the backend ``train_backend`` names (training/backends.py) with its rank and the
world size, after joining a torch.distributed group (gloo on CPU, NCCL on GPU): the torch trainer
runs data parallel over it (training/data_parallel.py), megatron its TP x PP x CP x DP ranks. The
group sends every call to every rank (train, restore, offload) or to rank 0 (weights, checkpoints,
exports: the ranks hold equal or gathered weights). ``RankZeroSender`` serves weight syncs from rank 0.
"""

from __future__ import annotations

import socket
from pathlib import Path

import torch

from miles_core.config import TrainConfig
from miles_core.training.protocol import TrainerContext, TrainOutput
from miles_core.weights.sync import WeightSender, host_copy


GATHERING = ("tensors", "meta", "broadcast", "save")  # WeightSender methods that read named_tensors() once


def free_address() -> str:
    host = socket.gethostbyname(socket.gethostname())
    with socket.socket() as s:
        s.bind(("", 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


class TrainWorker:
    """One rank (a Ray actor; plain class so tests may also build it in process)."""

    def __init__(self, cfg: TrainConfig, model_path: str, rank: int, world: int, num_threads: int | None = None):
        from transformers import AutoTokenizer

        if num_threads:
            torch.set_num_threads(num_threads)
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
            dist.init_process_group(backend, init_method=address, rank=self.rank, world_size=self.world)
        ctx = TrainerContext(cfg=self.cfg, model_path=Path(self.model_path), tokenizer=self.tokenizer, rank=self.rank,
                             world_size=self.world)
        self.trainer = TRAINERS[self.cfg.cluster.train_backend](ctx)
        self.sender = WeightSender(self.trainer.named_tensors, self.trainer.hf_config())
        return self.rank

    def run(self, method: str, *args):
        """trainer.<method>(*args): the Trainer protocol on this rank."""
        return getattr(self.trainer, method)(*args)

    def named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        return [(k, host_copy(v)) for k, v in self.trainer.named_tensors()]  # CPU: the driver may see no GPU

    def export(self, export_dir: str, rollout_id: int) -> str:
        return str(self.trainer.export(Path(export_dir), rollout_id, self.tokenizer))

    def extra_tensors(self) -> dict[str, list[tuple[str, torch.Tensor]]]:
        """The critic's (ppo) tensors, by module name, as named_tensors gives the policy's (tests)."""
        return {k: [(n, host_copy(t)) for n, t in m.state_dict().items()] for k, m in self.trainer.extra_modules().items()}

    def collective(self) -> bool:
        return getattr(self.trainer, "collective", False)

    def send(self, method: str, *args):
        """sender.<method>(*args) on rank 0. With a collective trainer every rank is called: the others take part
        in gathering the weights the sender reads (named_tensors), and send nothing."""
        if self.rank == 0:
            return getattr(self.sender, method)(*args)
        if method in GATHERING:
            list(self.trainer.named_tensors())
        return None


class TrainGroup:
    """The N workers as one Trainer; rank 0 is the source of weights, checkpoints and exports."""

    def __init__(self, cfg: TrainConfig, model_path: str, pg, bundles: list[int], resources: dict[str, float], backend: str):
        import ray

        from .placement import in_bundle

        world = len(bundles)
        threads = cfg.cluster.num_threads or 1
        cls = ray.remote(TrainWorker)
        self.workers = [cls.options(**resources, **in_bundle(pg, b)).remote(cfg, model_path, r, world, threads)
                        for r, b in enumerate(bundles)]
        try:
            address = ray.get(self.workers[0].address.remote())
            ray.get([w.start.remote(address, backend) for w in self.workers])
            self._hf_config = self.rank0("run", "hf_config")
            self.collective = self.rank0("collective")
        except BaseException:
            self.shutdown()  # a rank that failed to start frees its bundle: a retried prepare can place the group again
            raise
        self.steps_done = 0  # a fresh trainer on every rank; restore() sets it from the checkpoint

    def call(self, method: str, *args):
        """method(*args) on every rank. -> rank 0's answer."""
        import ray

        return ray.get([getattr(w, method).remote(*args) for w in self.workers])[0]

    def rank0(self, method: str, *args):
        import ray

        return ray.get(getattr(self.workers[0], method).remote(*args))

    def lead(self, method: str, *args):
        """method(*args) on rank 0, or on every rank when the trainer is collective. -> rank 0's answer."""
        return self.call(method, *args) if self.collective else self.rank0(method, *args)

    # ---- the Trainer protocol ----------------------------------------------------------------------
    def train_rollout(self, samples, rewards, rollout_id: int) -> TrainOutput:
        out = self.call("run", "train_rollout", samples, rewards, rollout_id)
        self.steps_done += len(out.steps)
        return out

    def named_tensors(self):
        return self.lead("named_tensors")

    def hf_config(self):
        return self._hf_config

    def mean_log_probs(self, samples) -> list[float]:
        return self.lead("run", "mean_log_probs", samples)

    def save(self, save_dir: Path, rollout_id: int, state: dict) -> None:
        self.lead("run", "save", save_dir, rollout_id, state)

    def restore(self, load_dir: Path) -> dict | None:
        meta = self.call("run", "restore", load_dir)
        if meta is not None:
            self.steps_done = meta["steps_done"]
        return meta

    def export(self, export_dir: Path, rollout_id: int, tokenizer=None) -> Path:
        return Path(self.lead("export", str(export_dir), rollout_id))

    def offload(self) -> None:
        self.call("run", "offload")

    def onload(self) -> None:
        self.call("run", "onload")

    def shutdown(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)


class RankZeroSender:
    """WeightSender's interface, served by train rank 0 (the bytes of broadcast and disk modes never
    pass through the driver; tensor mode fetches them through the object store)."""

    def __init__(self, group: "TrainGroup"):
        self.group = group

    def _call(self, method: str, *args):
        import ray

        workers = self.group.workers if self.group.collective and method in GATHERING else self.group.workers[:1]
        return ray.get([w.send.remote(method, *args) for w in workers])[0]

    def tensors(self):
        return self._call("tensors")

    def meta(self):
        return self._call("meta")

    def master_address(self):
        return self._call("master_address")

    def init_broadcast(self, host: str, port: int, world_size: int, backend: str) -> None:
        self._call("init_broadcast", host, port, world_size, backend)

    def broadcast(self, names: list[str]) -> None:
        self._call("broadcast", names)

    def save(self, path: str) -> str:
        return self._call("save", path)

"""The Trainer protocol: what a runtime asks of a training backend (ARCHITECTURE.md "Runtime").

A trainer owns the policy, its optimizer and the forward-only models (reference for KL, critic for
ppo, teacher for OPD). Implementations, by ``train_backend`` (backends.py): both are rl_step.RLTrainer, the
one RL step, over the backend's TrainEngine (engine.py): ``torch`` (torch_trainer.py, in process or one rank
of a Ray train group) and ``megatron`` (megatron/).

    train_rollout  forward-only log-probs (old / ref / teacher; values for ppo), advantages, then
                   num_steps_per_rollout optimizer steps -> TrainOutput
    named_tensors  HF-named full tensors (gathered across TP/PP/EP shards) for weight sync and export
    save / restore an atomic checkpoint of model + optimizer + RNG + the runtime's ``state``
    wait_saves     async_save: block until a checkpoint written in the background is complete
    export         an HF directory <export_dir>/<rollout_id>/
    offload/onload offload_train: the trained state to host memory while the engines generate, and back
    where          where that state lives now (training/offload.Where: bytes on the device, bytes on the host)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, NamedTuple, Protocol

import torch

from miles_core.config import TrainConfig
from miles_core.data.sample import Sample


class TrainOutput(NamedTuple):
    """One rollout of training: ``rollout`` metrics (rollout/*, perf/*) once, ``steps`` one dict of
    train/* metrics per optimizer step (a named pair: ``rollout, steps = trainer.train_rollout(...)``)."""

    rollout: dict[str, float]
    steps: list[dict[str, float]]


@dataclass(frozen=True)
class TrainerContext:
    """What a backend's builder gets: the config, the HF model dir, its tokenizer, this process's rank in
    the train group (0 of 1 in the local runtime), and how to serve a model as an engine (opd_type sglang
    scores with a teacher engine; the runtime passes the factory, trainers never import engines)."""

    cfg: TrainConfig
    model_path: Path
    tokenizer: object
    rank: int = 0
    world_size: int = 1
    make_engine: Callable[[object], object] | None = None


class Trainer(Protocol):
    steps_done: int
    collective: bool  # True: every method must run on every rank together (megatron); False: rank 0 alone may
                      # answer named_tensors / save / export / mean_log_probs (torch: the ranks hold equal replicas)

    def train_rollout(self, samples: list[Sample], rewards: list[float], rollout_id: int) -> TrainOutput: ...
    def named_tensors(self) -> Iterable[tuple[str, torch.Tensor]]: ...
    def hf_config(self): ...
    def mean_log_probs(self, samples: list[Sample]) -> list[float]: ...
    def save(self, save_dir: Path, rollout_id: int, state: dict) -> None: ...
    def restore(self, load_dir: Path) -> dict | None: ...
    def wait_saves(self) -> None: ...
    def export(self, export_dir: Path, rollout_id: int, tokenizer) -> Path: ...
    def offload(self) -> None: ...
    def where(self): ...  # offload.Where
    @property
    def offloaded(self) -> bool: ...  # parked or dropped, the cheap check
    def run_params(self) -> dict[str, str]: ...  # what the trainer chose (precision, layer spec), logged as derived.trainer.*
    def onload(self) -> None: ...

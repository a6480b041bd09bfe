"""The TrainEngine protocol: what the one RL step (rl_step.py) asks of a training backend.

An engine is what differs between backends: how to run a forward-only pass, a backward over a set of
rows, an optimizer step, how to hold, gather, save and move its weights. Implementations: ``TorchEngine``
(torch_trainer.py: transformers models, one process or FSDP2 data parallel, given its parallel strategy at
construction) and ``MegatronEngine`` (megatron/trainer.py: megatron-core stages, TP / PP / EP / DP).
What every backend does alike (the forward-only passes, advantages, the num_steps_per_rollout optimizer
steps, the learning-rate schedule, the rollout metrics) is rl_step.RLTrainer, written once.

    roles              which models the engine holds: "actor" always; "ref" (KL), "teacher" (an OPD teacher
                       model or engine), "critic" (ppo)
    forward_only       run fn(part, part_samples) -> RolloutTensors over this process's share of the rows and
                       -> the tensors over all rows (one process: fn(batch, samples); FSDP2: shares gathered)
    log_probs(role)    [N, T] response log-probs of "actor", "ref" or "teacher" (None: no such model, or not
                       on this pipeline stage)
    values             the critic's V [N, T] (None without a critic, or not on this stage)
    opd_topk_reverse_kl  top-k OPD's kl [N, T]: the old policy's full distribution per micro-batch, scored by a
                       teacher (its own, or an HttpTeacher given); the torch engine only (config rules refuse
                       opd_log_prob_top_k on train_backend megatron)
    backward(model)    gradients of loss_fn over ``rows`` of one global batch for "actor" or "critic", in
                       micro-batches (and this data-parallel rank's share); -> the loss metrics summed over
                       micro-batches and ranks. loss_fn(Piece) -> (loss, metrics)
    optimizer_step     set the learning rate, clip to clip_grad, ``check(grad_norm)`` (the NaN guard, before the
                       update), step; -> the grad norm before clipping
    last_stage         this process holds the outputs (the last pipeline stage; always True for torch);
                       from_last_stage(x) -> the last stage's x on every rank
    replays_step       the policy's forward in the optimizer step equals the old-policy pass (no dropout, each
                       rank sees every row): on-policy steps may take logp_old from it (rl_step.on_policy)
    dropout_free       the policy's train-mode forward has no dropout (skip_actor_forward_only needs it)
    dump_module(role)  the model whose passes the tensor dumps hook (dumps.py; None: no such model, or a rank that
                       writes no dumps); dump_ranks() -> {rank, world_size, parallel_info} of its dump files
    start_rollout(id)  the rollout whose passes and steps follow (the Megatron engine's before-train-step hook
                       names it; the torch engine keeps nothing per rollout)
    and the Trainer protocol's weights, checkpoints and export: named_tensors, hf_config, save / restore
    (``state`` carries steps_done), wait_saves (async_save), export, offload / onload / where (offload.py), run_params, num_params (perf/* FLOPs)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Literal, Protocol

import torch

from .batch import TokenBatch

Role = Literal["actor", "ref", "teacher"]
Trained = Literal["actor", "critic"]


@dataclass(frozen=True)
class StepShape:
    global_batch_size: int
    micro_batch_size: int
    num_steps: int


@dataclass
class RolloutTensors:
    """The per-token tensors of one rollout of training, each [N, T] over the batch's response tokens
    (N samples, T the longest response), built once by the forward-only passes and read by every step.

    old       logp_old: the policy before this rollout's updates (on-policy, rl_step.on_policy: zeros
              written by the first step from its own forward, ``fill_old``)
    ref       the reference model's log-probs (KL), None without one
    teacher   the OPD teacher's log-probs, None without OPD (and with top-k OPD)
    opd_kl    top-k OPD's reverse-KL estimate (opd_log_prob_top_k), else None
    values    the critic's values (ppo), None without a critic
    entropy   the old policy's entropy per position (use_rollout_entropy), else None
    adv       advantages; ``returns`` the critic's targets (ppo), else None
    """

    old: torch.Tensor | None
    ref: torch.Tensor | None
    teacher: torch.Tensor | None
    values: torch.Tensor | None
    adv: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    fill_old: bool = False
    entropy: torch.Tensor | None = None
    opd_kl: torch.Tensor | None = None


@dataclass(frozen=True)
class Piece:
    """One micro-batch's forward output, handed to a step's loss function: ``rows`` (n rollout rows), their
    loss_mask and rollout_log_probs [n, T] (T: the rows' longest response), and for the actor log_probs and
    entropy [n, T], for the critic values [n, T]."""

    rows: list[int]
    loss_mask: torch.Tensor
    rollout_log_probs: torch.Tensor
    log_probs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None


LossFn = Callable[[Piece], tuple[torch.Tensor, dict]]


class TrainEngine(Protocol):
    device: torch.device
    pad_id: int
    roles: frozenset[str]
    collective: bool
    last_stage: bool
    replays_step: bool
    dropout_free: bool

    def forward_only(self, fn: Callable, batch: TokenBatch, samples: list) -> RolloutTensors: ...
    def log_probs(self, role: Role, batch: TokenBatch) -> torch.Tensor | None: ...
    def actor_log_probs_and_entropy(self, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]: ...
    def values(self, batch: TokenBatch) -> torch.Tensor | None: ...
    def opd_topk_reverse_kl(self, batch: TokenBatch, samples: list, teacher=None) -> torch.Tensor: ...
    def backward(self, model: Trained, batch: TokenBatch, rows: range, loss_fn: LossFn) -> dict[str, float]: ...
    def optimizer_step(self, model: Trained, lr: float, check: Callable[[object], None]) -> float: ...
    def dump_module(self, role: str) -> torch.nn.Module | None: ...
    def dump_ranks(self) -> dict: ...
    def start_rollout(self, rollout_id: int) -> None: ...
    def reset_optimizer_states(self) -> None: ...
    def update_ref(self) -> None: ...
    def from_last_stage(self, obj): ...
    def num_params(self) -> int: ...
    def named_tensors(self) -> Iterable[tuple[str, torch.Tensor]]: ...
    def hf_config(self): ...
    def save(self, save_dir: Path, rollout_id: int, state: dict) -> None: ...
    def restore(self, load_dir: Path) -> dict | None: ...
    def wait_saves(self) -> None: ...
    def export(self, export_dir: Path, rollout_id: int, tokenizer) -> Path: ...
    def offload(self) -> None: ...
    def onload(self) -> None: ...
    def where(self): ...
    @property
    def offloaded(self) -> bool: ...
    def run_params(self) -> dict[str, str]: ...

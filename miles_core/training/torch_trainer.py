"""The torch trainer: forward-only passes (old, ref, teacher log-probs; critic values), advantages,
then num_steps_per_rollout AdamW steps over global batches split into micro-batches (gradient
accumulation; metrics summed, see Reducer). With ppo each step also updates the critic (critic.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from miles_core.algorithms import AdvantageInputs, LossInputs, Reducer, actor_loss, compute_advantages, masked_mean
from miles_core.config import TrainConfig
from miles_core.data.sample import Sample

from .batch import TokenBatch, forward_only, make_batch, per_token, prompt_units, response_log_probs
from .critic import Critic, build_critic
from .data_parallel import FullModule, FullOptimizer, as_float
from .perf import PhaseTimer, perf_metrics
from .protocol import TrainOutput
from .teacher import Teacher


@dataclass(frozen=True)
class StepShape:
    global_batch_size: int
    micro_batch_size: int
    num_steps: int


@dataclass
class RolloutTensors:
    """The per-token tensors of one rollout of training, each [N, T] over the batch's response tokens
    (N samples, T the longest response), built once by the forward-only passes and read by every step.

    old       logp_old: the policy before this rollout's updates (None until filled: on-policy, the first
              step writes it from its own forward, ``fill_old``)
    ref       the reference model's log-probs (KL), None without one
    teacher   the OPD teacher's log-probs, None without OPD
    values    the critic's values (ppo), None without a critic
    adv       advantages; ``returns`` the critic's targets (ppo), else None
    """

    old: torch.Tensor | None
    ref: torch.Tensor | None
    teacher: torch.Tensor | None
    values: torch.Tensor | None
    adv: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    fill_old: bool = False


class TorchTrainer:
    """Owns the policy, its optimizer and the forward-only models: reference (KL), critic (ppo), teacher (OPD)."""

    collective = False  # one process; FSDPDataParallel.attach sets it: every rank gathers weights, checkpoints and exports

    def __init__(self, model, cfg: TrainConfig, pad_id: int, ref_model=None, teacher: Teacher | None = None):
        self.model = model
        self.device = next(model.parameters()).device  # where the policy lives (miles_core/device.py); batches go there
        self.ref_model = ref_model
        self.teacher = teacher
        self.algo = cfg.algo
        self.checkpoint = cfg.checkpoint
        # use_kl_loss with kl_loss_coef 0 loads no reference model (REFERENCE §3), so the loss has no KL term
        no_ref_kl = ref_model is None and cfg.algo.use_kl_loss
        self.loss_algo = cfg.algo.model_copy(update={"use_kl_loss": False}) if no_ref_kl else cfg.algo
        self.temperature = cfg.rollout.rollout_temperature
        self.pad_id = pad_id
        self.shape = StepShape(cfg.global_batch_size, cfg.algo.micro_batch_size, cfg.num_steps_per_rollout)
        a = cfg.algo
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=a.lr, betas=(a.adam_beta1, a.adam_beta2), eps=a.adam_eps, weight_decay=a.weight_decay,
            fused=_fused_adam_ok(model),
        )
        self.critic = Critic(build_critic(model), a, a.micro_batch_size) if a.advantage_estimator == "ppo" else None
        self._dropout_free = _dropout_free(model)
        self._compile_pending = cfg.cluster.torch_compile  # compiled at the first optimizer step (compile_layers)
        if self._compile_pending:
            decoder_layers(model)  # fails here, before any step, for a model without a layer list
        self.steps_done = 0
        self.timer, self.peak_tflops = PhaseTimer(), cfg.cluster.mfu_peak_tflops
        self.dp = None  # data parallel (data_parallel.py, FSDPDataParallel.attach): shares of rows, gathers and sums over ranks

    @property
    def on_policy(self) -> bool:
        """Exactly on-policy: one optimizer step per rollout, no dropout, and logp_old read only by the loss
        (no critic, no data parallel, no OPD, no reward-level KL, not use_rollout_logprobs). The old-policy
        pass would then recompute the log-probs of the step's own forward (same weights, same tokens), so
        it is skipped and logp_old = logp.detach(): same loss and gradients (tests/training/test_torch_trainer.py)."""
        a = self.algo
        return (self.shape.num_steps == 1 and self.critic is None and self.dp is None and not a.use_opd
                and a.kl_coef == 0 and not a.use_rollout_logprobs and self._dropout_free)

    # ---- forward-only passes ------------------------------------------------------------------
    def compute_log_probs(self, model, batch: TokenBatch) -> torch.Tensor:
        """[N, T] log-probs of the response tokens, in micro-batches."""
        model.eval()
        fn = lambda piece: response_log_probs(model, piece, self.temperature, with_entropy=False)[0]  # noqa: E731
        return forward_only(fn, batch, self.shape.micro_batch_size)

    def _forward_only(self, batch: TokenBatch, samples: list[Sample]) -> RolloutTensors:
        """REFERENCE §1.3: old (and ref, teacher, critic values when used) per-token tensors [N, T].
        Data parallel: each rank computes its share of the rows, gathered so every rank has all of them."""
        if self.dp is not None:
            return self.dp.forward_only(self._local_forward_only, batch, samples)
        return self._local_forward_only(batch, samples)

    def _local_forward_only(self, batch: TokenBatch, samples: list[Sample]) -> RolloutTensors:
        if self.algo.use_rollout_logprobs:
            old = batch.rollout_log_probs
        elif self.on_policy:
            old = None  # filled by the optimizer step from its own forward
        else:
            with self.timer.phase("log_probs"):
                old = self.compute_log_probs(self.model, batch)
        with self.timer.phase("ref_log_probs", when=self.ref_model is not None):
            ref = self.compute_log_probs(self.ref_model, batch) if self.ref_model is not None else None
        with self.timer.phase("teacher_log_probs", when=self.teacher is not None):
            teacher = self._teacher_log_probs(batch, samples)
        values = self.critic.values(batch) if self.critic is not None else None
        return RolloutTensors(old=old, ref=ref, teacher=teacher, values=values)

    def _teacher_log_probs(self, batch: TokenBatch, samples: list[Sample]) -> torch.Tensor | None:
        """OPD: from the teacher (model or engine), else from the samples' teacher_log_probs; None without OPD."""
        if self.teacher is not None:
            return self.teacher.log_probs(batch)
        if self.algo.use_opd:
            try:
                return per_token(samples, "teacher_log_probs", batch.loss_mask.shape[1]).to(self.device)
            except ValueError as e:
                raise ValueError(f"{e}: use_opd without opd_teacher_load reads the teacher log-probs from the samples (set by a "
                                 "custom reward, post-process or generate function); set opd_teacher_load to score with a "
                                 "teacher model") from None
        return None

    # ---- one rollout of training ----------------------------------------------------------------
    def train_rollout(self, samples: list[Sample], rewards: list[float], rollout_id: int = 0) -> TrainOutput:
        """-> rollout-level metrics and one metrics dict per optimizer step.

        With a critic, rollouts before `num_critic_only_steps` update only the critic."""
        batch = make_batch(samples, self.pad_id).to(self.device)
        train_wait = self.timer.start_rollout()
        t0 = time.perf_counter()
        tensors = self._forward_only(batch, samples)
        adv_in = AdvantageInputs(
            rewards=torch.tensor(rewards, dtype=torch.float, device=self.device),
            group_index=torch.tensor([s.group_index for s in samples], device=self.device),
            loss_mask=batch.loss_mask, old_log_probs=tensors.old, ref_log_probs=tensors.ref,
            values=tensors.values, teacher_log_probs=tensors.teacher,
        )
        tensors.adv, tensors.returns, adv_metrics = compute_advantages(self.algo, adv_in)
        if tensors.old is None:
            tensors.old, tensors.fill_old = torch.zeros_like(batch.loss_mask), True  # [N, T], written by the step
        train_actor = self.critic is None or rollout_id >= self.algo.num_critic_only_steps
        steps = [self._optimizer_step(batch, tensors, k, train_actor) for k in range(self.shape.num_steps)]
        rollout_metrics = {
            "rollout/log_probs": float(masked_mean(tensors.old, batch.loss_mask)),
            "rollout/rollout_log_probs": float(masked_mean(batch.rollout_log_probs, batch.loss_mask)),
            **{f"rollout/{k}": v for k, v in adv_metrics.items()},
        }
        if tensors.ref is not None:
            rollout_metrics["rollout/ref_log_probs"] = float(masked_mean(tensors.ref, batch.loss_mask))
        dt = time.perf_counter() - t0
        tokens = float(batch.attention_mask.sum())
        rollout_metrics["perf/actor_train_time"] = dt
        rollout_metrics["perf/actor_train_tok_per_s"] = tokens * self.shape.num_steps / max(dt, 1e-9)
        rollout_metrics |= perf_metrics(self.timer, train_wait=train_wait, train_time=dt, tokens=tokens, num_steps=self.shape.num_steps,
                                        n_params=sum(p.numel() for p in self.model.parameters()), peak_tflops=self.peak_tflops)
        self.timer.end_rollout()
        return TrainOutput(rollout=rollout_metrics, steps=steps)

    def _optimizer_step(self, batch: TokenBatch, tensors: RolloutTensors, k: int, train_actor: bool = True) -> dict[str, float]:
        gbs = self.shape.global_batch_size
        rows = range(k * gbs, (k + 1) * gbs)
        reduce = Reducer(self.algo.calculate_per_token_loss, num_samples=gbs, num_tokens=float(batch.loss_mask[rows.start : rows.stop].sum()))
        metrics = self._actor_step(batch, tensors, rows, reduce) if train_actor else {}
        if self.critic is not None:
            critic_metrics = self.critic.step(batch, tensors.values, tensors.returns, rows, reduce, self._warmup(), self.dp)
            metrics |= {f"train/{name}": v for name, v in critic_metrics.items()}
        self.steps_done += 1
        return metrics

    def _actor_step(self, batch: TokenBatch, tensors: RolloutTensors, rows: range, reduce: Reducer) -> dict[str, float]:
        if self._compile_pending:
            compile_layers(self.model)
            self._compile_pending = False
        mb = self.shape.micro_batch_size
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        mine, most = self.dp.shard(batch, rows, mb) if self.dp is not None else (list(rows), 0)  # data parallel: this rank's rows
        unit = [0] * len(batch)
        for u, members in enumerate(prompt_units(batch)[0]):
            for r in members:
                unit[r] = u
        plan = plan_micro_batches(mine, batch.attention_mask.sum(-1).tolist(), mb, unit)
        for idx in plan:
            piece = batch.take(idx)
            T = piece.loss_mask.shape[1]
            cut = lambda x: None if x is None else x[idx, :T]  # noqa: E731
            logp, entropy = response_log_probs(self.model, piece, self.temperature, with_entropy=True,
                                               entropy_grad=self.algo.entropy_coef > 0)
            if tensors.fill_old:
                tensors.old[idx, :T] = logp.detach()
            inputs = LossInputs(
                log_probs=logp, old_log_probs=cut(tensors.old), advantages=cut(tensors.adv), loss_mask=piece.loss_mask,
                entropy=entropy, rollout_log_probs=piece.rollout_log_probs, ref_log_probs=cut(tensors.ref),
                teacher_log_probs=cut(tensors.teacher),
            )
            loss, metrics = actor_loss(self.loss_algo, inputs, reduce)
            loss.backward()
            for name, v in metrics.items():
                totals[name] = totals.get(name, 0.0) + float(v)
        if self.dp is not None:  # gradients summed over ranks by FSDP2, metric totals here (the Reducer's denominators are global)
            dummy = lambda: response_log_probs(self.model, batch.take([rows.start]), self.temperature, False)[0].sum()  # noqa: E731
            totals = self.dp.reduce_step(totals, most - len(plan), dummy)
        lr = self._set_lr()
        clip = self.algo.clip_grad if self.algo.clip_grad > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        self.optimizer.step()
        return {**{f"train/{k}": v for k, v in totals.items()}, "train/grad_norm": as_float(grad_norm), "train/lr-pg_0": lr}

    def _warmup(self) -> float:
        """Linear warm-up factor of the current optimizer step (1 without lr_warmup_iters)."""
        w = self.algo.lr_warmup_iters
        return min(1.0, (self.steps_done + 1) / w) if w else 1.0

    def _set_lr(self) -> float:
        lr = self.algo.lr * self._warmup()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    # ---- weights, checkpoints, export (the Trainer protocol) --------------------------------------
    def named_tensors(self):
        """HF-format names and tensors for weight sync and export (data parallel: gathered, a collective)."""
        return (self.dp.full_state(self.model) if self.dp is not None else self.model.state_dict()).items()

    def hf_config(self):
        return self.model.config

    def mean_log_probs(self, samples: list[Sample]) -> list[float]:
        """Per sample: the mean log-prob of its response tokens under the policy now (tests, diagnostics)."""
        batch = make_batch(samples, self.pad_id).to(self.device)
        logp = self.compute_log_probs(self.model, batch)  # [N, T]
        mask = batch.loss_mask.float()
        return ((logp * mask).sum(-1) / mask.sum(-1).clamp(min=1)).tolist()

    def save(self, save_dir: Path, rollout_id: int, state: dict) -> None:
        """An atomic checkpoint <save_dir>/<rollout_id>/ of policy, optimizer, RNG, critic and ``state``."""
        from miles_core import checkpoint as ckpt

        c = self.checkpoint
        model, optimizer = self._checkpoint_parts()
        extras, extra_optims = self.extra_modules(), self.extra_optimizers()
        if self.dp is not None:  # every rank gathers the full tensors (in this order), rank 0 writes them
            for part in [model, *extras.values()] + ([] if c.no_save_optim else [optimizer, *extra_optims.values()]):
                part.state_dict()
            if self.dp.rank != 0:
                return
        ckpt.save_checkpoint(save_dir, rollout_id, model=model, optimizer=optimizer,
                             state={**state, "steps_done": self.steps_done}, keep_last=c.keep_last,
                             save_optim=not c.no_save_optim, extra_tensors=extras or None, extra_optimizers=extra_optims or None)

    def restore(self, load_dir: Path) -> dict | None:
        """Load the latest complete checkpoint of load_dir (-> its meta), or None when there is none."""
        from miles_core import checkpoint as ckpt

        info = ckpt.find_latest(load_dir)
        if info is None:
            return None
        model, optimizer = self._checkpoint_parts()
        meta = ckpt.load_checkpoint(info, model=model, optimizer=optimizer,
                                    extra_modules=self.extra_modules() or None, extra_optimizers=self.extra_optimizers() or None)
        self.steps_done = meta["steps_done"]
        return meta

    def export(self, export_dir: Path, rollout_id: int, tokenizer) -> Path:
        from miles_core import checkpoint as ckpt

        if self.dp is None:
            return ckpt.export_hf(self.model, tokenizer, export_dir, rollout_id)
        model = self.dp.full_model(self.model)  # every rank gathers, rank 0 writes
        return ckpt.export_hf(model, tokenizer, export_dir, rollout_id) if self.dp.rank == 0 else Path(export_dir) / str(rollout_id)

    def offload(self) -> None:
        """Colocated training on a GPU frees device memory between train stages: every model and optimizer state
        moves to the CPU (contents kept) until ``onload``. On CPU there is nothing to free."""
        if self.device.type != "cpu":
            self._move_to(torch.device("cpu"))
            torch.cuda.empty_cache()

    def onload(self) -> None:
        if self.device.type != "cpu":
            self._move_to(self.device)

    def _move_to(self, device: torch.device) -> None:
        modules = [self.model, self.ref_model, getattr(self.teacher, "model", None)] + list(self.extra_modules().values())
        for module in modules:
            if module is not None:
                module.to(device)
        for opt in [self.optimizer, *self.extra_optimizers().values()]:
            for state in opt.state.values():
                for k, v in state.items():
                    if torch.is_tensor(v) and k != "step":  # the step count stays where the optimizer keeps it
                        state[k] = v.to(device)

    def extra_modules(self) -> dict[str, torch.nn.Module]:
        """Trained modules besides the policy, by name, to save and restore with a checkpoint: {"critic": ...} with ppo
        (data parallel: as data_parallel.FullModule, full tensors)."""
        if self.critic is None:
            return {}
        return {"critic": self.critic.module if self.dp is None else FullModule(self.critic.module)}

    def extra_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Their optimizers, by the same names (data parallel: as data_parallel.FullOptimizer)."""
        if self.critic is None:
            return {}
        c = self.critic
        return {"critic": c.optimizer if self.dp is None else FullOptimizer(c.module, c.optimizer)}

    def _checkpoint_parts(self):
        """(policy, optimizer) as the checkpoint code reads and loads them (data parallel: full tensors)."""
        if self.dp is None:
            return self.model, self.optimizer
        return FullModule(self.model), FullOptimizer(self.model, self.optimizer)


def plan_micro_batches(rows: list[int], lengths: list[int], size: int, unit: list[int] | None = None) -> list[list[int]]:
    """rows split into micro-batches of ``size`` after a stable sort by sequence length (lengths[r]), so rows
    of similar length share a micro-batch (less padding). With ``unit`` (unit[r]: the prompt group of row
    r), a group's rows stay adjacent, groups ordered by their longest row, so a micro-batch computes each
    shared prompt once (batch.response_logits). The loss is a sum over samples (Reducer denominators are
    global), so the grouping does not change the step."""
    unit = unit if unit is not None else list(range(len(lengths)))
    longest: dict[int, int] = {}
    for r in rows:
        longest[unit[r]] = max(longest.get(unit[r], 0), lengths[r])
    order = sorted(rows, key=lambda r: (longest[unit[r]], unit[r], lengths[r]))
    return [order[s : s + size] for s in range(0, len(order), size)]


def decoder_layers(model) -> torch.nn.ModuleList:
    """The policy's decoder layers (``base_model.layers`` of a transformers causal LM)."""
    layers = getattr(getattr(model, "base_model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        kind = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise ValueError(f"torch_compile: the policy ({kind}) has no decoder layer list at base_model.layers to compile; "
                         "drop torch_compile for this model")
    return layers


def compile_layers(model) -> None:
    """``torch.compile`` each decoder layer (inductor, dynamic shapes: packed rows change width every step).
    The layers share their code, so the first one's graphs (forward, backward; train and no-grad mode) serve
    all of them, the weights being graph inputs. Called at the first optimizer step, not at construction: a
    deepcopy of the policy (the local engine's copy) made after it would keep calling the original layers."""
    for layer in decoder_layers(model):
        layer.compile(dynamic=True)


def _dropout_free(model) -> bool:
    """No dropout in train mode: no nn.Dropout with p > 0 and no attention/hidden dropout in the HF config."""
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return False
    config = getattr(model, "config", None)
    return not any(float(getattr(config, k, 0.0) or 0.0) > 0 for k in ("attention_dropout", "hidden_dropout", "dropout"))


def _fused_adam_ok(model) -> bool | None:
    """Fused AdamW (one kernel over all parameters) where torch has it for them; None = torch's default."""
    return True if all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in model.parameters()) else None

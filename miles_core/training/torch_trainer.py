"""The torch trainer: old/ref log-probs, advantages, then num_steps_per_rollout AdamW steps over
global batches split into micro-batches (gradient accumulation; metrics summed, see Reducer).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from miles_core.algorithms import AdvantageInputs, LossInputs, Reducer, actor_loss, compute_advantages, masked_mean
from miles_core.config import TrainConfig
from miles_core.data.sample import Sample

from .batch import TokenBatch, make_batch, response_log_probs


@dataclass(frozen=True)
class StepShape:
    global_batch_size: int
    micro_batch_size: int
    num_steps: int


class TorchTrainer:
    """Owns the policy (and optional reference model) and its optimizer."""

    def __init__(self, model, cfg: TrainConfig, pad_id: int, ref_model=None):
        self.model = model
        self.ref_model = ref_model
        self.algo = cfg.algo
        self.temperature = cfg.rollout.rollout_temperature
        self.pad_id = pad_id
        self.shape = StepShape(cfg.global_batch_size, cfg.algo.micro_batch_size, cfg.num_steps_per_rollout)
        a = cfg.algo
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=a.lr, betas=(a.adam_beta1, a.adam_beta2), eps=a.adam_eps, weight_decay=a.weight_decay
        )
        self.steps_done = 0

    # ---- forward-only passes ------------------------------------------------------------------
    @torch.no_grad()
    def compute_log_probs(self, model, batch: TokenBatch) -> torch.Tensor:
        """[N, T] log-probs of the response tokens, in micro-batches."""
        model.eval()
        mb = self.shape.micro_batch_size
        parts = []
        for s in range(0, len(batch), mb):
            piece = batch.slice(s, s + mb)
            lp, _ = response_log_probs(model, piece, self.temperature, with_entropy=False)
            parts.append(torch.nn.functional.pad(lp, (0, batch.loss_mask.shape[1] - lp.shape[1])))
        return torch.cat(parts)

    # ---- one rollout of training ----------------------------------------------------------------
    def train_rollout(self, samples: list[Sample], rewards: list[float]) -> tuple[dict[str, float], list[dict[str, float]]]:
        """-> (rollout-level metrics, one metrics dict per optimizer step)."""
        batch = make_batch(samples, self.pad_id)
        t0 = time.perf_counter()
        old_lp = batch.rollout_log_probs if self.algo.use_rollout_logprobs else self.compute_log_probs(self.model, batch)
        ref_lp = self.compute_log_probs(self.ref_model, batch) if self.ref_model is not None else None
        adv_in = AdvantageInputs(
            rewards=torch.tensor(rewards, dtype=torch.float), group_index=torch.tensor([s.group_index for s in samples]),
            loss_mask=batch.loss_mask, old_log_probs=old_lp, ref_log_probs=ref_lp,
        )
        advantages, _, adv_metrics = compute_advantages(self.algo, adv_in)
        rollout_metrics = {
            "rollout/log_probs": float(masked_mean(old_lp, batch.loss_mask)),
            "rollout/rollout_log_probs": float(masked_mean(batch.rollout_log_probs, batch.loss_mask)),
            **{f"rollout/{k}": v for k, v in adv_metrics.items()},
        }
        if ref_lp is not None:
            rollout_metrics["rollout/ref_log_probs"] = float(masked_mean(ref_lp, batch.loss_mask))
        tensors = {"old": old_lp, "ref": ref_lp, "adv": advantages}
        steps = [self._optimizer_step(batch, tensors, k) for k in range(self.shape.num_steps)]
        dt = time.perf_counter() - t0
        tokens = float(batch.attention_mask.sum())
        rollout_metrics["perf/actor_train_time"] = dt
        rollout_metrics["perf/actor_train_tok_per_s"] = tokens * self.shape.num_steps / max(dt, 1e-9)
        return rollout_metrics, steps

    def _optimizer_step(self, batch: TokenBatch, tensors: dict, k: int) -> dict[str, float]:
        gbs, mb = self.shape.global_batch_size, self.shape.micro_batch_size
        lo, hi = k * gbs, (k + 1) * gbs
        reduce = Reducer(self.algo.calculate_per_token_loss, num_samples=gbs, num_tokens=float(batch.loss_mask[lo:hi].sum()))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        for s in range(lo, hi, mb):
            piece = batch.slice(s, min(s + mb, hi))
            T = piece.loss_mask.shape[1]
            cut = lambda x: None if x is None else x[s : s + len(piece), :T]  # noqa: E731
            logp, entropy = response_log_probs(self.model, piece, self.temperature, with_entropy=True)
            inputs = LossInputs(
                log_probs=logp, old_log_probs=cut(tensors["old"]), advantages=cut(tensors["adv"]), loss_mask=piece.loss_mask,
                entropy=entropy, rollout_log_probs=piece.rollout_log_probs, ref_log_probs=cut(tensors["ref"]),
            )
            loss, metrics = actor_loss(self.algo, inputs, reduce)
            loss.backward()
            for name, v in metrics.items():
                totals[name] = totals.get(name, 0.0) + float(v)
        lr = self._set_lr()
        clip = self.algo.clip_grad if self.algo.clip_grad > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        self.optimizer.step()
        self.steps_done += 1
        return {**{f"train/{k}": v for k, v in totals.items()}, "train/grad_norm": float(grad_norm), "train/lr-pg_0": lr}

    def _set_lr(self) -> float:
        a = self.algo
        lr = a.lr * min(1.0, (self.steps_done + 1) / a.lr_warmup_iters) if a.lr_warmup_iters else a.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    # ---- weights ------------------------------------------------------------------------------
    def named_tensors(self):
        """HF-format names and tensors for weight sync and export."""
        return self.model.state_dict().items()

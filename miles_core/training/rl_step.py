"""The RL step, written once for every backend: RLTrainer, the Trainer protocol over a TrainEngine (engine.py).

One rollout (train_rollout):
    1. forward-only passes (REFERENCE §1.3): old policy log-probs (unless use_rollout_logprobs, or exactly
       on-policy: see ``on_policy``), reference (KL), OPD teacher (a teacher model, the HTTP teachers of
       opd_teacher_urls, else the samples' teacher_log_probs; with opd_log_prob_top_k the top-k estimate instead),
       critic values (ppo); each [N, T]
    2. advantages (algorithms.compute_advantages), on the process holding the outputs (last pipeline stage)
       (disable_compute_advantages_and_returns: neither 1 nor 2, as the reference's train_actor)
    3. num_steps_per_rollout optimizer steps of global_batch_size rows: actor_loss with the Reducer's global
       denominators, backward in micro-batches inside the engine, grad-norm clip clip_grad, the NaN guard
       (finite.py), AdamW at schedule.learning_rate; with ppo the critic's value_loss step after the actor's
       (only the critic before num_critic_only_steps rollouts)
    4. the rollout metrics (rollout/*, perf/*: perf.py) -> TrainOutput, equal on every rank
    Profiling (use_pytorch_profiler's train_overall, record_memory_history's snapshot): a step of ``profiler`` per
    rollout (profiler.py)
Each pass of 1 and each backward of 3 runs in a tensor-dump scope (dumps.py: dumper_fwd_only / dumper_fwd_bwd),
which does nothing with those phases off.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import torch

from miles_core import finite
from miles_core.algorithms import AdvantageInputs, LossInputs, Reducer, actor_loss, compute_advantages, masked_mean, value_loss
from miles_core.config import TrainConfig
from miles_core.data.sample import Sample
from miles_core.rollout.metrics import correct_sample_metrics

from .batch import TokenBatch, make_batch, per_token
from .dumps import TrainDumps
from .engine import LossFn, Piece, RolloutTensors, StepShape, TrainEngine
from .perf import PhaseTimer, perf_metrics
from .profiler import TrainProfiler
from .protocol import TrainOutput
from .teacher import HttpTeacher
from .schedule import learning_rate
from .rollout_data import hook as rollout_data_hook, postprocess as postprocess_rollout_data
from .train_dump import save_train_data


class RLTrainer:
    """The Trainer protocol (protocol.py) over one engine: the step here, the models in ``engine``."""

    def __init__(self, engine: TrainEngine, cfg: TrainConfig, profiler: TrainProfiler | None = None):
        self.engine = engine
        self.profiler = TrainProfiler.of(cfg) if profiler is None else profiler  # use_pytorch_profiler, record_memory_history
        self.algo = cfg.algo
        # use_kl_loss with kl_loss_coef 0 loads no reference model (REFERENCE §3), so the loss has no KL term
        no_ref_kl = "ref" not in engine.roles and cfg.algo.use_kl_loss
        self.loss_algo = cfg.algo.model_copy(update={"use_kl_loss": False}) if no_ref_kl else cfg.algo
        self.shape = StepShape(cfg.global_batch_size, cfg.algo.micro_batch_size, cfg.num_steps_per_rollout)
        self.timer, self.peak_tflops = PhaseTimer(), cfg.cluster.mfu_peak_tflops
        self.train_dump = cfg.misc.train_dump  # save_debug_train_data (or dump_details'): the path template, or None
        self.dumps = TrainDumps(cfg, **engine.dump_ranks())  # the tensor dumps of the passes (dumper_enable)
        self._rollout_id = 0  # the rollout being trained: its dumps' dir
        self.steps_done = 0
        # log_correct_samples: rollout/correct_* against rollout_max_response_len (rollout/metrics.correct_sample_metrics)
        self.correct_len = cfg.rollout.rollout_max_response_len if cfg.tracking.log_correct_samples else None
        self.http_teacher = HttpTeacher.of(cfg.algo) if cfg.algo.use_opd and cfg.algo.opd_teacher_urls else None
        self.postprocess = rollout_data_hook(cfg)  # rollout_data_postprocess_path: (fn, args) or None
        if cfg.algo.skip_actor_forward_only and not engine.dropout_free:
            raise ValueError("skip_actor_forward_only takes logp_old from the step's own train-mode forward, which "
                             "differs from the old policy's under dropout: use a model without dropout (attention_dropout, "
                             "hidden_dropout, lora_dropout 0), or drop skip_actor_forward_only")
        self.profiler.started()  # train_overall's profiler, from the built trainer on (the reference's on_init_end)

    @property
    def collective(self) -> bool:
        return self.engine.collective

    @property
    def on_policy(self) -> bool:
        """Exactly on-policy: one optimizer step per rollout, an engine whose step forward replays the old-policy
        pass (no dropout, every row on this rank), and logp_old read only by the loss (no critic, no OPD, no
        reward-level KL, not use_rollout_logprobs). The old-policy pass would then recompute the log-probs of the
        step's own forward (same weights, same tokens), so it is skipped and logp_old = logp.detach(): same loss
        and gradients (tests/training/test_torch_trainer.py). skip_actor_forward_only asks for it whatever the
        layout (its load rules refuse what would change the step); disable_compute_advantages_and_returns: no logp_old."""
        a = self.algo
        if a.disable_compute_advantages_and_returns:
            return False
        if a.skip_actor_forward_only:
            return not a.use_rollout_logprobs
        return (self.shape.num_steps == 1 and self.engine.replays_step and "critic" not in self.engine.roles
                and not a.use_opd and a.kl_coef == 0 and not a.use_rollout_logprobs and not a.use_rollout_entropy)

    # ---- one rollout of training ----------------------------------------------------------------
    def train_rollout(self, samples: list[Sample], rewards: list[float], rollout_id: int = 0) -> TrainOutput:
        """-> rollout-level metrics and one metrics dict per optimizer step (module docstring)."""
        self._resident("train_rollout")
        engine = self.engine
        engine.start_rollout(rollout_id)
        self._rollout_id = rollout_id
        batch = make_batch(samples, engine.pad_id).to(engine.device)
        train_wait = self.timer.start_rollout()
        t0 = time.perf_counter()
        tensors = self.forward_passes(batch, samples)
        compute = engine.last_stage and not self.algo.disable_compute_advantages_and_returns
        adv_metrics = self._advantages(batch, tensors, samples, rewards) if compute else {}
        if self.postprocess is not None and engine.last_stage:
            batch = postprocess_rollout_data(*self.postprocess, samples, rewards, batch, tensors)
        if self.on_policy:
            tensors.old, tensors.fill_old = torch.zeros_like(batch.loss_mask), True  # [N, T], written by the step
        train_actor = "critic" not in engine.roles or rollout_id >= self.algo.num_critic_only_steps
        if self.algo.reset_optimizer_states:
            engine.reset_optimizer_states()  # the reference's train loop, before each rollout's steps
        with finite.in_rollout(rollout_id):
            steps = [self._optimizer_step(batch, tensors, k, train_actor) for k in range(self.shape.num_steps)]
        rollout = self._rollout_metrics(batch, tensors, adv_metrics, samples, rewards) if engine.last_stage else {}
        if self.train_dump is not None and engine.last_stage:
            save_train_data(self.train_dump, rollout_id, samples, rewards, batch, tensors)
        interval = self.algo.ref_update_interval
        if interval and (rollout_id + 1) % interval == 0:
            engine.update_ref()  # the KL terms of the next rollouts pull toward the policy as it is now
        rollout |= self._perf(batch, train_wait, time.perf_counter() - t0)
        self.timer.end_rollout()
        self.profiler.step(rollout_id)  # train_overall's next step; the memory snapshot when due
        rollout, steps = engine.from_last_stage((rollout, steps))
        return TrainOutput(rollout=rollout, steps=steps)

    def forward_passes(self, batch: TokenBatch, samples: list[Sample]) -> RolloutTensors:
        """Step 1: the forward-only tensors [N, T] (the engine splits the rows over its ranks and gathers)."""
        return self.engine.forward_only(self._local_passes, batch, samples)

    def _local_passes(self, batch: TokenBatch, samples: list[Sample]) -> RolloutTensors:
        engine = self.engine
        if self.algo.disable_compute_advantages_and_returns:
            return RolloutTensors(old=None, ref=None, teacher=None, values=None)
        entropy = None
        if self.algo.use_rollout_logprobs:
            old = batch.rollout_log_probs
        elif self.on_policy:
            old = None  # filled by the optimizer step from its own forward
        elif self.algo.use_rollout_entropy:
            with self.timer.phase("log_probs"), self._dumped("fwd_only", "actor"):
                old, entropy = engine.actor_log_probs_and_entropy(batch)
        else:
            with self.timer.phase("log_probs"), self._dumped("fwd_only", "actor"):
                old = engine.log_probs("actor", batch)
        with self.timer.phase("ref_log_probs", when="ref" in engine.roles), self._dumped("fwd_only", "ref"):
            ref = engine.log_probs("ref", batch)
        teacher, opd_kl = None, None
        with self.timer.phase("teacher_log_probs", when="teacher" in engine.roles or self.http_teacher is not None):
            if self.algo.use_opd and self.algo.opd_log_prob_top_k:
                opd_kl = engine.opd_topk_reverse_kl(batch, samples, self.http_teacher)  # [N, T]
            else:
                teacher = self._teacher_log_probs(batch, samples)
        with self._dumped("fwd_only", "critic"):
            values = engine.values(batch)
        return RolloutTensors(old=old, ref=ref, teacher=teacher, values=values, entropy=entropy, opd_kl=opd_kl)

    def _dumped(self, phase: str, role: str):
        """The tensor-dump scope of one pass of ``role``'s model (dumps.py): <phase>/<role>_rollout_<id>, the actor's
        without a prefix."""
        prefix = "" if role == "actor" else f"{role}_"
        return self.dumps.phase(phase, self.engine.dump_module(role), self._rollout_id, prefix)

    def _teacher_log_probs(self, batch: TokenBatch, samples: list[Sample]) -> torch.Tensor | None:
        """OPD: from the teacher (model or engine), the HTTP teachers (opd_teacher_urls), else from the samples'
        teacher_log_probs; None without OPD."""
        if "teacher" in self.engine.roles:
            with self._dumped("fwd_only", "teacher"):
                return self.engine.log_probs("teacher", batch)
        if not self.algo.use_opd:
            return None
        if self.http_teacher is not None:
            return self.http_teacher.log_probs(batch, samples).to(self.engine.device)
        try:
            return per_token(samples, "teacher_log_probs", batch.loss_mask.shape[1]).to(self.engine.device)
        except ValueError as e:
            raise ValueError(f"{e}: use_opd without opd_teacher_load reads the teacher log-probs from the samples (set by a "
                             "custom reward, post-process or generate function); set opd_teacher_load to score with a "
                             "teacher model") from None

    def _advantages(self, batch: TokenBatch, tensors: RolloutTensors, samples: list[Sample], rewards: list[float]) -> dict:
        """Step 2: tensors.adv and .returns filled; -> the advantage metrics."""
        device = self.engine.device
        adv_in = AdvantageInputs(
            rewards=torch.tensor(rewards, dtype=torch.float, device=device),
            group_index=torch.tensor([s.group_index for s in samples], device=device),
            loss_mask=batch.loss_mask, old_log_probs=tensors.old, ref_log_probs=tensors.ref,
            values=tensors.values, teacher_log_probs=tensors.teacher, opd_reverse_kl=tensors.opd_kl,
        )
        tensors.adv, tensors.returns, adv_metrics = compute_advantages(self.algo, adv_in)
        return adv_metrics

    # ---- step 3: the optimizer steps --------------------------------------------------------------
    def _optimizer_step(self, batch: TokenBatch, tensors: RolloutTensors, k: int, train_actor: bool) -> dict[str, float]:
        gbs = self.shape.global_batch_size
        rows = range(k * gbs, (k + 1) * gbs)
        reduce = Reducer(self.algo.calculate_per_token_loss, num_samples=gbs, num_tokens=float(batch.loss_mask[rows.start : rows.stop].sum()))
        metrics = self._actor_step(batch, tensors, rows, reduce) if train_actor else {}
        if "critic" in self.engine.roles:
            metrics |= self._critic_step(batch, tensors, rows, reduce)
        self.steps_done += 1
        return metrics

    def _actor_step(self, batch: TokenBatch, tensors: RolloutTensors, rows: range, reduce: Reducer) -> dict[str, float]:
        with self._dumped("fwd_bwd", "actor"):  # parameters and gradients dumped before the clip and the update
            totals = self.engine.backward("actor", batch, rows, self._actor_loss(batch, tensors, reduce))
        lr = learning_rate(self.algo.lr, self.algo.lr_warmup_iters, self.steps_done)
        check = partial(finite.check_loss_and_grad, totals.get("loss"), step=self.steps_done)
        grad_norm = self.engine.optimizer_step("actor", lr, check)
        return {**{f"train/{k}": v for k, v in totals.items()}, "train/grad_norm": grad_norm, "train/lr-pg_0": lr}

    def _critic_step(self, batch: TokenBatch, tensors: RolloutTensors, rows: range, reduce: Reducer) -> dict[str, float]:
        with self._dumped("fwd_bwd", "critic"):
            totals = self.engine.backward("critic", batch, rows, self._value_loss(tensors, reduce))
        lr = learning_rate(self.algo.critic_lr or self.algo.lr, self.algo.critic_lr_warmup_iters, self.steps_done)
        check = partial(finite.check_loss_and_grad, totals.get("critic-value_loss"), model="critic")
        grad_norm = self.engine.optimizer_step("critic", lr, check)
        return {**{f"train/{k}": v for k, v in totals.items()}, "train/critic-grad_norm": grad_norm, "train/critic-lr-pg_0": lr}

    def _actor_loss(self, batch: TokenBatch, tensors: RolloutTensors, reduce: Reducer) -> LossFn:
        """actor_loss of one micro-batch (on-policy: its log-probs are also logp_old, written into tensors.old)."""
        response_lengths = (batch.resp_index >= 0).sum(-1).tolist()  # [N]
        total_lengths = batch.attention_mask.sum(-1).tolist()  # [N]

        def loss(piece: Piece):
            rows, T = piece.rows, piece.loss_mask.shape[1]
            if tensors.fill_old:
                tensors.old[rows, :T] = piece.log_probs.detach()
            cut = lambda x: None if x is None else x[rows, :T]  # noqa: E731
            inputs = LossInputs(
                log_probs=piece.log_probs, old_log_probs=cut(tensors.old), advantages=cut(tensors.adv),
                loss_mask=piece.loss_mask, entropy=piece.entropy, rollout_log_probs=piece.rollout_log_probs,
                ref_log_probs=cut(tensors.ref), teacher_log_probs=cut(tensors.teacher), opd_reverse_kl=cut(tensors.opd_kl),
                response_lengths=[response_lengths[i] for i in rows], total_lengths=[total_lengths[i] for i in rows],
            )
            return actor_loss(self.loss_algo, inputs, reduce)
        return loss

    def _value_loss(self, tensors: RolloutTensors, reduce: Reducer) -> LossFn:
        """The critic's clipped value loss of one micro-batch (algorithms.value_loss)."""
        def loss(piece: Piece):
            cut = (piece.rows, slice(0, piece.loss_mask.shape[1]))
            return value_loss(self.algo, piece.values, tensors.values[cut], tensors.returns[cut], piece.loss_mask, reduce)
        return loss

    # ---- step 4: metrics --------------------------------------------------------------------------
    def _rollout_metrics(self, batch: TokenBatch, tensors: RolloutTensors, adv_metrics: dict, samples: list[Sample],
                         rewards: list[float]) -> dict[str, float]:
        out = {
            "rollout/rollout_log_probs": float(masked_mean(batch.rollout_log_probs, batch.loss_mask)),
            **{f"rollout/{k}": v for k, v in adv_metrics.items()},
        }
        if tensors.old is not None and not self.algo.skip_actor_forward_only:  # the reference logs no skipped pass
            out["rollout/log_probs"] = float(masked_mean(tensors.old, batch.loss_mask))
        if tensors.entropy is not None:  # the reference's per-sample masked mean, averaged over samples
            out["rollout/entropy"] = float(masked_mean(tensors.entropy, batch.loss_mask, dim=-1).mean())
        if tensors.ref is not None:
            out["rollout/ref_log_probs"] = float(masked_mean(tensors.ref, batch.loss_mask))
        if self.correct_len is not None:  # log_correct_samples (its rules keep the old-policy pass on)
            logp = masked_mean(tensors.old, batch.loss_mask, dim=-1).tolist()  # [N]
            out |= correct_sample_metrics(samples, rewards, self.correct_len, logp)
        return out

    def _perf(self, batch: TokenBatch, train_wait: float, dt: float) -> dict[str, float]:
        tokens, n = float(batch.attention_mask.sum()), self.shape.num_steps
        out = {"perf/actor_train_time": dt, "perf/actor_train_tok_per_s": tokens * n / max(dt, 1e-9)}
        return out | perf_metrics(self.timer, train_wait=train_wait, train_time=dt, tokens=tokens, num_steps=n,
                                  n_params=self.engine.num_params(), peak_tflops=self.peak_tflops)

    # ---- the rest of the Trainer protocol: the engine's -----------------------------------------------
    def mean_log_probs(self, samples: list[Sample]) -> list[float]:
        """Per sample: the mean log-prob of its response tokens under the policy now (tests, diagnostics)."""
        self._resident("mean_log_probs")
        batch = make_batch(samples, self.engine.pad_id).to(self.engine.device)
        logp = self.engine.log_probs("actor", batch)  # [N, T]
        mask = batch.loss_mask.float()
        means = None if logp is None else ((logp * mask).sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
        return self.engine.from_last_stage(means)

    def save(self, save_dir: Path, rollout_id: int, state: dict) -> None:
        """An atomic checkpoint of the engine's models and optimizers, RNG and ``state`` (with steps_done)."""
        self._resident("save")
        self.engine.save(save_dir, rollout_id, {**state, "steps_done": self.steps_done})

    def restore(self, load_dir: Path) -> dict | None:
        """Load the latest complete checkpoint of load_dir (-> its meta), or None when there is none."""
        meta = self.engine.restore(load_dir)
        if meta is not None:
            self.steps_done = meta["steps_done"]
        return meta

    def wait_saves(self) -> None:
        """async_save: until the checkpoint written in the background is complete."""
        self.engine.wait_saves()

    def named_tensors(self):
        self._resident("named_tensors")
        return self.engine.named_tensors()

    def adapter_tensors(self):
        """lora_sync_from_tensor: (adapter_config.json, the adapter's tensors); the torch engine's (rules.py refuses others)."""
        self._resident("adapter_tensors")
        return self.engine.adapter_tensors()

    def hf_config(self):
        return self.engine.hf_config()

    def export(self, export_dir: Path, rollout_id: int, tokenizer) -> Path:
        self._resident("export")
        return self.engine.export(export_dir, rollout_id, tokenizer)

    def _resident(self, what: str) -> None:
        """A member that reads the trained state, called while it is offloaded (offload_train), fails naming itself
        rather than reading freed storages (the runtime onloads before every stage that reads it)."""
        if self.engine.offloaded:
            raise RuntimeError(f"{what}: the trainer's state is offloaded (offload_train); onload() it first")

    def offload(self) -> None:
        self.engine.offload()

    def onload(self) -> None:
        self.engine.onload()

    def where(self):
        """offload.Where: bytes of the trained state on the device and parked on the host."""
        return self.engine.where()

    def run_params(self) -> dict[str, str]:
        return self.engine.run_params()

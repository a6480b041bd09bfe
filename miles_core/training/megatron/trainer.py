"""The Megatron trainer: megatron-core's GPTModel (this rank's TP / PP / EP share), its DDP and optimizer,
and its pipeline schedules, running the same RL math as the torch trainer (miles_core/algorithms).

One rollout (train_rollout):
    1. forward-only log-probs: old policy (unless use_rollout_logprobs), reference (KL), OPD teacher
       (opd_teacher_load: a stage of the teacher's own shape), on the last pipeline stage, with
       log_softmax(logits / rollout_temperature), vocab-parallel under TP
    2. advantages (compute_advantages), on the last stage
    3. num_steps_per_rollout optimizer steps of global_batch_size samples: this data-parallel rank's rows
       in micro-batches (micro_batch_size samples, or packed to max_tokens_per_gpu tokens with
       use_dynamic_batch_size) through megatron's forward-backward schedule; actor_loss with the
       torch trainer's Reducer (global denominators), so gradients and metric totals are sums over
       micro-batches and data-parallel ranks; grad-norm clip clip_grad; Adam.
With ppo a critic (critic.py) gives the values for GAE in step 1 and is updated at each step 3 (only
the critic before num_critic_only_steps rollouts, as the torch trainer).
Metrics come from the last pipeline stage and are broadcast to every rank.

megatron's calculate_per_token_loss is set on its TransformerConfig so that its schedule and DDP
neither divide the loss by the number of micro-batches nor average gradients over data-parallel ranks:
the Reducer's denominators already make the loss the step's mean (REFERENCE §3).
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from miles_core.algorithms import AdvantageInputs, LossInputs, Reducer, actor_loss, compute_advantages, masked_mean
from miles_core.config import TrainConfig
from miles_core.config.rules import check_model_divides
from miles_core.data.sample import Sample
from miles_core.device import resolve_device
from miles_core.models.shape import shape_from_config
from miles_core.training.batch import TokenBatch, make_batch, per_token
from miles_core.training.protocol import TrainOutput
from miles_core.training.schedule import set_lr, warmup_factor
from miles_core.training.torch_trainer import RolloutTensors

from . import batching, checkpoint, logprobs, model, optim, parallel, weights
from .critic import MegatronCritic
from .logprobs import mask_padded_vocab
from .model_args import ModelArgs, from_hf_config

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_hf_state(path: Path, args: ModelArgs) -> dict[str, torch.Tensor]:
    """The HF checkpoint's tensors under the HF model's state-dict names, validated against its config.json."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    state = dict(hf.state_dict())
    if not args.untie_embeddings_and_output_weights:
        state.pop("lm_head.weight", None)
    weights.validate_hf(state, args, str(path))
    return state


class MegatronTrainer:
    """Owns the policy stage (DDP-wrapped), its optimizer and the forward-only stages: reference (KL), teacher (OPD)."""

    collective = True  # every method is a collective over the train group: a Ray train group calls it on every rank

    def __init__(self, cfg: TrainConfig, model_path: Path, pad_id: int):
        self.cfg, self.algo, self.p = cfg, cfg.algo, cfg.parallel
        self.temperature = cfg.rollout.rollout_temperature
        self.pad_id = pad_id
        self.model_path = Path(model_path)
        hf_config = json.loads((self.model_path / "config.json").read_text())
        check_model_divides(shape_from_config(hf_config), self.p, str(self.model_path))
        self.args = from_hf_config(hf_config, str(self.model_path / "config.json")).padded_for(self.p.tensor_model_parallel_size)
        self.device = resolve_device(cfg.cluster.device).type  # cpu here: a GPU is refused at run start (preflight)
        parallel.init_parallel(self.p, cfg.misc.seed, self.device)
        self.dtype = DTYPES[cfg.misc.dtype]
        self.tconfig = model.transformer_config(self.args, self.p, self.dtype, cpu=self.device == "cpu")
        self.tconfig.calculate_per_token_loss = True  # see the module docstring
        hf_state = load_hf_state(self.model_path, self.args)
        self.model, self.optimizer = self._build_policy(hf_state)
        self.critic = MegatronCritic(self, hf_state) if cfg.algo.advantage_estimator == "ppo" else None
        self.ref_model = self._build_ref() if cfg.needs_ref_model else None
        self.teacher_model = self._build_teacher() if cfg.algo.use_opd and cfg.algo.opd_teacher_load else None
        self.loss_algo = cfg.algo.model_copy(update={"use_kl_loss": False}) if self.ref_model is None and cfg.algo.use_kl_loss else cfg.algo
        self.steps_done = 0

    # ---- building ------------------------------------------------------------------------------
    def _stage(self, hf_state: dict[str, torch.Tensor], args: ModelArgs | None = None, tconfig=None):
        """A stage of the model ``args`` (default the policy's) under ``tconfig``, holding hf_state's weights."""
        args, tconfig = args or self.args, tconfig or self.tconfig
        stage = model.build_stage(args, tconfig)
        local = weights.shard(weights.hf_to_full(hf_state, args), stage)
        stage.load_state_dict({k: v.to(self.dtype) for k, v in local.items()}, strict=False)
        return stage

    def _build_policy(self, hf_state):
        distributed = self.p.use_distributed_optimizer
        ddp = optim.wrap_ddp(self.tconfig, self._stage(hf_state), distributed_optimizer=distributed)
        self.params = [p for p in ddp.parameters() if p.requires_grad]
        if distributed:
            return ddp, optim.distributed_adamw(ddp, self.algo, self.algo.lr, self.dtype)
        return ddp, optim.adamw(self.params, self.algo, self.algo.lr, self.cfg.cluster.device)

    def _build_ref(self):
        path = Path(self.cfg.checkpoint.ref_load) if self.cfg.checkpoint.ref_load else self.model_path
        return self._stage(load_hf_state(path, self.args)).eval()

    def _build_teacher(self):
        """The OPD teacher (opd_teacher_load, opd_type megatron): a forward-only stage of its own shape, under the
        policy's parallel layout; it must share the student's vocabulary (training/teacher.py)."""
        from miles_core.env import cache_dir
        from miles_core.models import resolve_model_path

        path = resolve_model_path(self.algo.opd_teacher_load, cache_dir())
        hf_config = json.loads((path / "config.json").read_text())
        check_model_divides(shape_from_config(hf_config), self.p, str(path))
        args = from_hf_config(hf_config, str(path / "config.json")).padded_for(self.p.tensor_model_parallel_size)
        if args.vocab_size != self.args.vocab_size:
            raise ValueError(f"opd_teacher_load {self.algo.opd_teacher_load}: teacher vocab_size {args.vocab_size} != student "
                             f"vocab_size {self.args.vocab_size}; OPD compares log-probs of the same token ids, so teacher and "
                             "student must share the tokenizer")
        tconfig = model.transformer_config(args, self.p, self.dtype, cpu=self.cfg.cluster.device == "cpu")
        tconfig.calculate_per_token_loss = True
        return self._stage(load_hf_state(path, args), args, tconfig).eval()

    # ---- forward passes ------------------------------------------------------------------------
    def _response_logits(self, mb: batching.MicroBatch, out: torch.Tensor) -> torch.Tensor:
        """out [b, S, V/TP] -> [n, T, V/TP] logits / temperature (float32) at the positions predicting mb's response tokens."""
        logits = out.reshape(-1, out.shape[-1])[mb.flat_index].float() / self.temperature
        return mask_padded_vocab(logits, self.args.vocab_size)

    def compute_log_probs(self, stage, batch: TokenBatch) -> torch.Tensor | None:
        """[N, T] response log-probs on the last pipeline stage (None on the others), micro-batched."""
        max_tokens = (self.p.log_probs_max_tokens_per_gpu or self.p.max_tokens_per_gpu) if self.p.use_dynamic_batch_size else None
        mbs = batching.plan(batch, list(range(len(batch))), self.algo.micro_batch_size, max_tokens)
        return batching.forward_only(stage, batch, mbs, lambda mb, out: logprobs.token_log_probs(self._response_logits(mb, out), mb.resp_tokens))

    # ---- one rollout of training ---------------------------------------------------------------
    def train_rollout(self, samples: list[Sample], rewards: list[float], rollout_id: int = 0) -> TrainOutput:
        from megatron.core import parallel_state as ps

        batch = make_batch(samples, self.pad_id)
        t0 = time.perf_counter()
        last = ps.is_pipeline_last_stage()
        old = batch.rollout_log_probs if self.algo.use_rollout_logprobs else self.compute_log_probs(self.model, batch)
        ref = self.compute_log_probs(self.ref_model, batch) if self.ref_model is not None else None
        teacher = self._teacher_log_probs(batch, samples)
        values = self.critic.values(batch) if self.critic is not None else None
        tensors = RolloutTensors(old=old, ref=ref, teacher=teacher, values=values)  # [N, T] each, on the last stage
        rollout = {}
        if last:
            adv_in = AdvantageInputs(
                rewards=torch.tensor(rewards, dtype=torch.float), group_index=torch.tensor([s.group_index for s in samples]),
                loss_mask=batch.loss_mask, old_log_probs=old, ref_log_probs=ref, values=values, teacher_log_probs=teacher,
            )
            tensors.adv, tensors.returns, adv_metrics = compute_advantages(self.algo, adv_in)
            rollout = {"rollout/log_probs": float(masked_mean(old, batch.loss_mask)),
                       "rollout/rollout_log_probs": float(masked_mean(batch.rollout_log_probs, batch.loss_mask)),
                       **{f"rollout/{k}": v for k, v in adv_metrics.items()}}
            if ref is not None:
                rollout["rollout/ref_log_probs"] = float(masked_mean(ref, batch.loss_mask))
        train_actor = self.critic is None or rollout_id >= self.algo.num_critic_only_steps
        steps = [self._optimizer_step(batch, tensors, k, train_actor) for k in range(self.cfg.num_steps_per_rollout)]
        dt = time.perf_counter() - t0
        rollout["perf/actor_train_time"] = dt
        rollout["perf/actor_train_tok_per_s"] = float(batch.attention_mask.sum()) * len(steps) / max(dt, 1e-9)
        rollout, steps = parallel.from_last_stage((rollout, steps))
        return TrainOutput(rollout=rollout, steps=steps)

    def _teacher_log_probs(self, batch: TokenBatch, samples: list[Sample]) -> torch.Tensor | None:
        """OPD: the teacher model's log-probs (last stage), else the samples' teacher_log_probs; None without OPD."""
        if self.teacher_model is not None:
            return self.compute_log_probs(self.teacher_model, batch)
        return per_token(samples, "teacher_log_probs", batch.loss_mask.shape[1]) if self.algo.use_opd else None

    def _optimizer_step(self, batch: TokenBatch, tensors: RolloutTensors, k: int, train_actor: bool = True) -> dict[str, float]:
        gbs = self.cfg.global_batch_size
        rows = range(k * gbs, (k + 1) * gbs)
        reduce = Reducer(self.algo.calculate_per_token_loss, num_samples=gbs, num_tokens=float(batch.loss_mask[rows.start : rows.stop].sum()))
        metrics = self._actor_step(batch, tensors, rows, reduce) if train_actor else {}
        if self.critic is not None:
            warmup = warmup_factor(self.algo, self.steps_done)
            critic = self.critic.step(batch, tensors.values, tensors.returns, rows, reduce, warmup)
            metrics |= {f"train/{name}": v for name, v in critic.items()}
        self.steps_done += 1
        return metrics

    def _actor_step(self, batch: TokenBatch, tensors: RolloutTensors, rows: range, reduce: Reducer) -> dict[str, float]:
        max_tokens = self.p.max_tokens_per_gpu if self.p.use_dynamic_batch_size else None
        mbs = batching.plan(batch, parallel.my_rows(rows), self.algo.micro_batch_size, max_tokens)
        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        for r in batching.run(self.model, mbs, partial(self._loss, tensors, reduce), forward_only=False):
            for name, v in r.items():
                totals[name] = totals.get(name, 0.0) + v
        totals = parallel.sum_over_data_parallel(totals)
        lr = set_lr(self.optimizer, self.algo, self.steps_done)
        grad_norm = optim.step(self.optimizer, self.params, self.algo.clip_grad)
        return {**{f"train/{n}": v for n, v in totals.items()}, "train/grad_norm": grad_norm, "train/lr-pg_0": lr}

    def _loss(self, tensors: RolloutTensors, reduce: Reducer, mb: batching.MicroBatch, out: torch.Tensor):
        """actor_loss on one micro-batch (last stage): -> (loss, token count, float metrics)."""
        logits = self._response_logits(mb, out)
        T = mb.loss_mask.shape[1]
        cut = lambda x: None if x is None else x[mb.rows, :T]  # noqa: E731
        with_entropy = self.algo.entropy_coef > 0
        entropy = logprobs.entropy(logits if with_entropy else logits.detach())
        inputs = LossInputs(
            log_probs=logprobs.token_log_probs(logits, mb.resp_tokens), old_log_probs=cut(tensors.old),
            advantages=cut(tensors.adv), loss_mask=mb.loss_mask, entropy=entropy, rollout_log_probs=mb.rollout_log_probs,
            ref_log_probs=cut(tensors.ref), teacher_log_probs=cut(tensors.teacher),
        )
        loss, metrics = actor_loss(self.loss_algo, inputs, reduce)
        return loss, torch.tensor(1), {name: float(v) for name, v in metrics.items()}

    # ---- weights ------------------------------------------------------------------------------
    def hf_state(self) -> dict[str, torch.Tensor]:
        """The whole policy in HF names (TP/PP/EP shards gathered; every rank gets it)."""
        hf = weights.full_to_hf(weights.gather_full(self.model.module), self.args)
        if not self.args.untie_embeddings_and_output_weights:
            hf["lm_head.weight"] = hf["model.embed_tokens.weight"]  # as the tied HF model's state dict has it
        return hf

    def named_tensors(self):
        return self.hf_state().items()

    def hf_model(self):
        """The policy as a transformers model (CPU, float32) holding the gathered weights."""
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_config(self.hf_config(), dtype=torch.float32)
        hf.load_state_dict(self.hf_state())
        return hf.eval()

    def export(self, export_dir: Path, rollout_id: int, tokenizer) -> Path:
        """An HF snapshot <export_dir>/<rollout_id>/ (checkpoint.export.export_hf), written by rank 0; collective."""
        from miles_core.checkpoint.export import export_hf

        hf = self.hf_model()  # every rank takes part in the gather
        path = Path(export_dir) / str(rollout_id)
        if dist.get_rank() == 0:
            path = export_hf(hf, tokenizer, export_dir, rollout_id)
        dist.barrier()
        return path

    def hf_config(self):
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(self.model_path)

    def mean_log_probs(self, samples: list[Sample]) -> list[float]:
        """Per sample, the masked mean log-prob of its response under the current policy (last stage's, broadcast)."""
        batch = make_batch(samples, self.pad_id)
        logp = self.compute_log_probs(self.model, batch)
        means = None if logp is None else ((logp * batch.loss_mask).sum(-1) / batch.loss_mask.sum(-1).clamp(min=1)).tolist()
        return parallel.from_last_stage(means)

    def save(self, save_dir: Path, rollout_id: int, state: dict) -> None:
        """An atomic torch_dist checkpoint (checkpoint.py); collective over the train group."""
        checkpoint.save(self, save_dir, rollout_id, state)

    def restore(self, load_dir: Path) -> dict | None:
        return checkpoint.restore(self, load_dir)

    def offload(self) -> None:
        if self.device != "cpu":
            raise NotImplementedError("offload of the megatron trainer on cuda is not supported yet")

    def onload(self) -> None:
        self.offload()

    def close(self) -> None:
        """Destroy megatron's process groups (and the one-rank world if the trainer started it)."""
        parallel.teardown()


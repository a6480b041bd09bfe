"""The torch training backend: TorchEngine (transformers models, the TrainEngine protocol of engine.py) and
TorchTrainer, the one RL step (rl_step.RLTrainer) over it.

The engine owns the policy, its AdamW and the forward-only models: reference (KL), critic (ppo, critic.py),
teacher (OPD, teacher.py). Its parallel strategy is given at construction (data_parallel.py): SingleProcess,
or FSDPDataParallel, which shards the policy and critic before their optimizers are built. A backward runs
the strategy's share of the global batch's rows in micro-batches (gradient accumulation; metrics summed, see
Reducer), packed by prompt (plan_micro_batches).
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from miles_core.config import TrainConfig
from miles_core.checkpoint.writer import CheckpointWriter, Write
from miles_core.config.train import critic_dir_of

from .batch import TokenBatch, forward_only, prompt_units, response_log_probs, response_logits
from .critic import Critic, build_critic, response_values
from .data_parallel import SingleProcess, as_float
from .disk import park_of
from .disk_adam import moments_of
from .engine import LossFn, Piece, RolloutTensors
from .lora import AdapterView, NoAdapters
from .offload import Offloader, module_tensors, optimizer_tensors
from .precision import Precision
from .profiler import TrainProfiler
from .rl_step import RLTrainer
from .schedule import reset_adam_state
from .teacher import Teacher, TopK

if TYPE_CHECKING:
    from miles_core.checkpoint import CheckpointInfo


class TorchEngine:
    """The policy, its optimizer and the forward-only models on one device, under a parallel strategy."""

    last_stage = True

    def __init__(self, model, cfg: TrainConfig, pad_id: int, ref_model=None, teacher: Teacher | None = None,
                 parallel=None, lora=None, profiler: TrainProfiler | None = None):
        self.parallel = parallel or SingleProcess()
        self.profiler = profiler or TrainProfiler()  # profile_target train_actor / train_log_probs: the micro-batch loops
        self.lora = lora or NoAdapters()  # LoRA adapters (lora.py): injected before the policy is wrapped
        model = self.lora.apply(model)
        self.device = next(model.parameters()).device  # where the policy lives (miles_core/device.py); batches go there
        self.precision = Precision.of(cfg.misc.dtype, self.device)  # fp32 main weights, 16-bit forward (precision.py)
        self.precision.check_trained(model, "policy")
        self.ref_model, self.teacher, self.pad_id = ref_model, teacher, pad_id
        self.algo, self.checkpoint = cfg.algo, cfg.checkpoint
        self.temperature = cfg.rollout.rollout_temperature
        self.micro_batch_size = cfg.algo.micro_batch_size
        self.pad_to = cfg.parallel.data_pad_size_multiplier  # the policy's packed rows hold a multiple of it (no TP here)
        self.apply_updates = not cfg.misc.debug_disable_optimizer
        self._compile_pending = cfg.cluster.torch_compile  # compiled at the first optimizer step (compile_layers)
        if self._compile_pending:
            decoder_layers(model)  # fails here, before any step, for a model without a layer list
        self._dropout_free = _dropout_free(model)
        critic = build_critic(model) if cfg.algo.advantage_estimator == "ppo" else None  # from the unsharded policy
        self.model = self.parallel.wrap(model)
        a = cfg.algo
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=a.lr, betas=(a.adam_beta1, a.adam_beta2), eps=a.adam_eps,
            weight_decay=a.weight_decay, fused=_fused_adam_ok(self.model),
        )
        self.critic = None if critic is None else Critic(self.parallel.wrap(critic), a, a.micro_batch_size, self.precision.autocast)
        self.roles = frozenset({"actor"} | {r for r, m in (("ref", ref_model), ("teacher", teacher), ("critic", self.critic)) if m is not None})
        self._offloader = Offloader(self._state_tensors, self.device, park_of(cfg, self.device))
        # stream_optimizer_state_to_disk: each AdamW's moments in files between steps (disk_adam.py), else resident
        self.moments = {"actor": moments_of(cfg, self.optimizer, "actor", self.device)}
        if self.critic is not None:
            self.moments["critic"] = moments_of(cfg, self.critic.optimizer, "critic", self.device)
        self.writer = CheckpointWriter(cfg.checkpoint.async_save)  # save(): now, or in a background thread

    @property
    def collective(self) -> bool:
        """Data parallel: every rank gathers weights, checkpoints and exports (the train group calls every rank)."""
        return self.parallel.collective

    @property
    def replays_step(self) -> bool:
        return self._dropout_free and self.parallel.whole_batch

    @property
    def dropout_free(self) -> bool:
        return self._dropout_free

    # ---- forward passes ----------------------------------------------------------------------------
    def compute_log_probs(self, model, batch: TokenBatch) -> torch.Tensor:
        """[N, T] log-probs of the response tokens, in micro-batches."""
        model.eval()
        chunk = self.algo.log_probs_chunk_size
        fn = lambda piece: response_log_probs(model, piece, self.temperature, with_entropy=False, chunk_size=chunk,
                                                 pad_to=self.pad_to)[0]  # noqa: E731
        with self.precision.autocast():
            return forward_only(fn, batch, self.micro_batch_size, loop=self._log_probs_loop)

    def forward_only(self, fn, batch: TokenBatch, samples: list) -> RolloutTensors:
        """Data parallel: each rank computes its share of the rows, gathered so every rank has all of them."""
        return self.parallel.forward_only(fn, batch, samples)

    def actor_log_probs_and_entropy(self, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """use_rollout_entropy: the old-policy pass with the entropy of each position, both [N, T] (detached)."""
        self.model.eval()
        T, entropies = batch.loss_mask.shape[1], []

        def fn(piece):
            logp, entropy = response_log_probs(self.model, piece, self.temperature, with_entropy=True, entropy_grad=False,
                                               pad_to=self.pad_to)
            entropies.append(torch.nn.functional.pad(entropy, (0, T - entropy.shape[1])))
            return logp

        with self.precision.autocast():
            logp = forward_only(fn, batch, self.micro_batch_size, loop=self._log_probs_loop)
        return logp, torch.cat(entropies)

    def _log_probs_loop(self, starts):
        return self.profiler.loop("train_log_probs", starts)

    @torch.no_grad()
    def opd_topk_reverse_kl(self, batch: TokenBatch, samples: list, teacher=None) -> torch.Tensor:
        """Top-k OPD's kl [N, T] (algorithms/opd.py): per micro-batch, the old policy's full distribution
        log_softmax(logits / T) [n, t, V] handed to ``teacher`` (default: this engine's own teacher model)."""
        teacher = teacher or self.teacher
        topk = TopK.of(self.algo)
        self.model.eval()
        T, parts = batch.loss_mask.shape[1], []
        for s in range(0, len(batch), self.micro_batch_size):
            piece = batch.slice(s, s + self.micro_batch_size)
            with self.precision.autocast():
                logits = response_logits(self.model, piece, self.pad_to)
            student = torch.log_softmax(logits.float() / self.temperature, dim=-1)  # [n, t, V]
            kl = teacher.topk_kl(student, piece, samples[s : s + self.micro_batch_size], topk)  # [n, t]
            parts.append(torch.nn.functional.pad(kl, (0, T - kl.shape[1])))
        return torch.cat(parts)

    def log_probs(self, role: str, batch: TokenBatch) -> torch.Tensor | None:
        if role == "teacher":
            return None if self.teacher is None else self.teacher.log_probs(batch)
        model = self.model if role == "actor" else self.ref_model
        return None if model is None else self.compute_log_probs(model, batch)

    def values(self, batch: TokenBatch) -> torch.Tensor | None:
        return None if self.critic is None else self.critic.values(batch)

    def from_last_stage(self, obj):
        return obj

    # ---- tensor dumps (dumps.py) ------------------------------------------------------------------------
    def dump_module(self, role: str) -> torch.nn.Module | None:
        """The model of ``role`` (actor, ref, teacher, critic) whose passes are dumped; None without one, and on a
        data-parallel rank but 0 (its share of the rows is not dumped, as the reference's DP rank > 0)."""
        if self.parallel.rank != 0:
            return None
        critic = None if self.critic is None else self.critic.module
        return {"actor": self.model, "ref": self.ref_model, "teacher": getattr(self.teacher, "model", None), "critic": critic}[role]

    def dump_ranks(self) -> dict:
        """rank, world_size and parallel_info of this process's dump files (the dumper's static meta)."""
        return {"rank": self.parallel.rank, "world_size": self.parallel.world, "parallel_info": {}}

    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    # ---- backward and optimizer step -------------------------------------------------------------------
    def backward(self, model: str, batch: TokenBatch, rows: range, loss_fn: LossFn) -> dict[str, float]:
        """Gradients of loss_fn over this rank's share of ``rows``, in micro-batches; -> the metric totals
        (data parallel: gradients summed over ranks by FSDP2, totals by the strategy; the Reducer's denominators
        are global)."""
        actor = model == "actor"
        if actor and self._compile_pending:
            compile_layers(self.model)
            self._compile_pending = False
        module, optimizer = (self.model, self.optimizer) if actor else (self.critic.module, self.critic.optimizer)
        module.train()
        optimizer.zero_grad(set_to_none=True)
        mine, most = self.parallel.shard(batch, rows, self.micro_batch_size)
        plan = self._plan(batch, mine) if actor else [mine[s : s + self.micro_batch_size] for s in range(0, len(mine), self.micro_batch_size)]
        forward = self._actor_piece if actor else self._critic_piece
        totals: dict[str, float] = {}
        for idx in (self.profiler.loop("train_actor", plan) if actor else plan):
            loss, metrics = loss_fn(forward(batch.take(idx), idx))
            loss.backward()
            for name, v in metrics.items():
                totals[name] = totals.get(name, 0.0) + float(v)
        dummy = lambda: self._dummy(actor, batch.take([rows.start]))  # noqa: E731
        return self.parallel.reduce_step(totals, most - len(plan), dummy)

    def _plan(self, batch: TokenBatch, mine: list[int]) -> list[list[int]]:
        unit = [0] * len(batch)
        for u, members in enumerate(prompt_units(batch)[0]):
            for r in members:
                unit[r] = u
        return plan_micro_batches(mine, batch.attention_mask.sum(-1).tolist(), self.micro_batch_size, unit)

    def _actor_piece(self, piece: TokenBatch, idx: list[int]) -> Piece:
        with self.precision.autocast():
            logp, entropy = response_log_probs(self.model, piece, self.temperature, with_entropy=self.algo.train_entropy,
                                               entropy_grad=self.algo.entropy_coef > 0, pad_to=self.pad_to)
        return Piece(rows=idx, loss_mask=piece.loss_mask, rollout_log_probs=piece.rollout_log_probs, log_probs=logp, entropy=entropy)

    def _critic_piece(self, piece: TokenBatch, idx: list[int]) -> Piece:
        with self.precision.autocast():
            values = response_values(self.critic.module, piece)
        return Piece(rows=idx, loss_mask=piece.loss_mask, rollout_log_probs=piece.rollout_log_probs, values=values)

    def _dummy(self, actor: bool, row: TokenBatch) -> torch.Tensor:
        """A scalar through the sharded module (data parallel: a zero-weighted pass of a rank with fewer micro-batches)."""
        with self.precision.autocast():
            if actor:
                return response_log_probs(self.model, row, self.temperature, False, pad_to=self.pad_to)[0].sum()
            return response_values(self.critic.module, row).sum()

    def start_rollout(self, rollout_id: int) -> None:
        """Nothing is kept per rollout here (no per-rollout hooks on this engine)."""

    def reset_optimizer_states(self) -> None:
        """reset_optimizer_states: a fresh Adam state for the actor and the critic."""
        for optimizer in (self.optimizer, *([] if self.critic is None else [self.critic.optimizer])):
            reset_adam_state(optimizer)

    def update_ref(self) -> None:
        """ref_update_interval: the reference model takes the policy's weights (data parallel: gathered, a collective)."""
        self.ref_model.load_state_dict(self.parallel.full_state(self.model))

    def optimizer_step(self, model: str, lr: float, check) -> float:
        """lr on every param group, grad-norm clip clip_grad, ``check(grad_norm)`` before the update, AdamW (not with
        debug_disable_optimizer: the gradients are dropped by the next backward's zero_grad)."""
        module, optimizer = (self.model, self.optimizer) if model == "actor" else (self.critic.module, self.critic.optimizer)
        for group in optimizer.param_groups:
            group["lr"] = lr
        clip = self.algo.clip_grad if self.algo.clip_grad > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
        check(grad_norm)
        if self.apply_updates:
            self.moments[model].step()  # optimizer.step(), or streamed through the moments' files
        return as_float(grad_norm)

    # ---- weights, checkpoints, export ----------------------------------------------------------------
    def named_tensors(self):
        """HF-format names and tensors in the model dtype for weight sync (data parallel: gathered, a collective): with
        LoRA the merged weights, or the frozen base with lora_train_only (lora.py engine_state)."""
        return list(self.precision.to_model_dtype(self.lora.engine_state(self.parallel.full_state(self.model)).items()))

    def adapter_tensors(self):
        """lora_sync_from_tensor: (adapter_config.json as a dict, the adapter tensors named as in
        adapter_model.safetensors, model dtype) for engines that serve it unmerged (data parallel: gathered)."""
        return self.lora.adapter_payload(self.model, self.parallel.full_state(self.model), self.precision.model_dtype)

    def hf_config(self):
        return self.model.config

    def run_params(self) -> dict[str, str]:
        """What this engine chose from the config and the machine, for the run's params (derived.trainer.*)."""
        p = self.precision
        return {"device": self.device.type, "main_dtype": str(p.main_dtype).removeprefix("torch."),
                "autocast": str(p.model_dtype).removeprefix("torch.") if p.mixed else "off"}

    def _moments_resident(self) -> contextlib.ExitStack:
        """stream_optimizer_state_to_disk: every optimizer's moments back in its state inside (disk_adam.py)."""
        stack = contextlib.ExitStack()
        for moments in self.moments.values():
            stack.enter_context(moments.resident())
        return stack

    def save(self, save_dir: Path, rollout_id: int, state: dict) -> None:
        """An atomic checkpoint <save_dir>/<rollout_id>/ of policy, optimizer, RNG, extra modules and ``state``; with
        ppo the critic's own first, <critic_save>/<rollout_id>/ (the actor's ``latest``, written last, commits both).
        Data parallel: every rank gathers the full tensors, rank 0 writes them. Streamed moments: read back for it."""
        with self._moments_resident():
            self._save(save_dir, rollout_id, state)

    def _save(self, save_dir: Path, rollout_id: int, state: dict) -> None:
        c = self.checkpoint
        model, optimizer = self._checkpoint_parts()
        if self.lora.enabled:
            state = {**state, "lora_base_sha256": self.lora.base_sha256}
        extras, extra_optims = self._actor_extras()
        critic = self._critic_parts()
        modules, optims = [model, *extras.values()], [optimizer, *extra_optims.values()]
        if critic is not None:
            modules, optims = modules + [critic[0]], optims + [critic[1]]
        self.parallel.gather_for_save(modules + ([] if c.no_save_optim else optims))
        if self.parallel.rank != 0:
            return
        common = {"keep_last": c.keep_last, "save_optim": not c.no_save_optim}
        writes = [] if critic is None else [Write(self._critic_dir(self.algo.critic_save, save_dir), rollout_id, {
            "model": critic[0], "optimizer": critic[1], "state": {"role": "critic", "actor_dir": str(save_dir)}, **common})]
        writes.append(Write(save_dir, rollout_id, {"model": model, "optimizer": optimizer, "state": state, **common,
                                                   "extra_tensors": extras or None, "extra_optimizers": extra_optims or None}))
        self.writer.write(writes)  # async_save: snapshotted now, written by a background thread

    def wait_saves(self) -> None:
        """async_save: block until the checkpoint being written in the background is complete (its error raised)."""
        self.writer.wait()

    def restore(self, load_dir: Path) -> dict | None:
        """Load the latest complete checkpoint of load_dir (-> its meta), or None when there is none; with ppo the
        critic's checkpoint of the same rollout from critic_load (or, from an actor checkpoint that holds its critic,
        from there)."""
        with self._moments_resident():  # streamed moments: the loaded ones are written to their files after
            return self._restore(load_dir)

    def _restore(self, load_dir: Path) -> dict | None:
        from miles_core import checkpoint as ckpt

        info = ckpt.find_latest(load_dir)
        if info is None:
            return None
        if self.lora.enabled:
            self.lora.check_base(info.meta.get("lora_base_sha256"), info.path)
        model, optimizer = self._checkpoint_parts()
        extras, extra_optims = self._actor_extras()
        critic = self._critic_parts()
        inside = critic is not None and "critic" in info.meta["contents"]["extra"]  # a checkpoint from before critic_save
        if inside:
            extras, extra_optims = {**extras, "critic": critic[0]}, {**extra_optims, "critic": critic[1]}
        meta = ckpt.load_checkpoint(info, model=model, optimizer=optimizer, extra_modules=extras or None,
                                    extra_optimizers=extra_optims or None)
        if critic is not None and not inside:
            self._restore_critic(self._critic_dir(self.algo.critic_load, load_dir), info, critic)
        return meta

    @staticmethod
    def _critic_dir(explicit: str | None, actor_dir: Path) -> Path:
        return Path(explicit).absolute() if explicit else critic_dir_of(Path(actor_dir))

    def _restore_critic(self, critic_dir: Path, actor: CheckpointInfo, critic: tuple) -> None:
        """The critic's checkpoint of the actor's rollout id (not its latest: a save that failed between the two leaves
        the critic one ahead), checksums verified; refused when there is none (it cannot resume with the actor)."""
        from miles_core import checkpoint as ckpt

        found = {i.rollout_id: i for i in ckpt.list_checkpoints(critic_dir)}
        if actor.rollout_id not in found:
            have = sorted(found) or "none"
            raise ckpt.CheckpointError(f"critic_load: {critic_dir} has no complete checkpoint of rollout {actor.rollout_id} "
                                       f"(the actor's, {actor.path}; it has {have}): the ppo critic cannot resume with the "
                                       "actor; set critic_load to the dir its critic_save wrote")
        ckpt.load_checkpoint(found[actor.rollout_id], model=critic[0], optimizer=critic[1], restore_rng=False)

    def _critic_parts(self):
        """(module, optimizer) of the ppo critic as the checkpoint code reads them (data parallel: full), or None."""
        return None if self.critic is None else self.parallel.checkpoint_parts(self.critic.module, self.critic.optimizer)

    def _actor_extras(self) -> tuple[dict, dict]:
        """extra_modules / extra_optimizers but the critic's (which has a checkpoint dir of its own)."""
        mods, opts = self.extra_modules(), self.extra_optimizers()
        return {k: v for k, v in mods.items() if k != "critic"}, {k: v for k, v in opts.items() if k != "critic"}

    def _checkpoint_parts(self):
        """(module, optimizer) as the checkpoint code reads them; with LoRA the adapters only (lora.AdapterView)."""
        model, optimizer = self.parallel.checkpoint_parts(self.model, self.optimizer)
        return (AdapterView(model) if self.lora.enabled else model), optimizer

    def export(self, export_dir: Path, rollout_id: int, tokenizer) -> Path:
        """An HF snapshot in the model dtype (the fp32 main weights converted); data parallel: every rank gathers, rank 0 writes.
        With LoRA: the merged model (base + scaled BA, the base's names) plus the PEFT adapter in its ``adapter/``."""
        from miles_core import checkpoint as ckpt

        if self.lora.enabled:
            state = self.parallel.full_state(self.model)  # every rank takes part in the gather
            if self.parallel.rank != 0:
                return Path(export_dir) / str(rollout_id)
            model, dtype = merged_model(self.model.config, self.lora.merged_state(state)), self.precision.model_dtype
            adapter = lambda tmp: self.lora.save_adapter(self.model, tmp / "adapter", dtype, state)  # noqa: E731
            return ckpt.export_hf(model, tokenizer, export_dir, rollout_id, dtype=dtype, extra=adapter)
        model = self.parallel.full_model(self.model)
        if self.parallel.rank != 0:
            return Path(export_dir) / str(rollout_id)
        return ckpt.export_hf(model, tokenizer, export_dir, rollout_id, dtype=self.precision.model_dtype)

    def offload(self) -> None:
        """offload_train: the weights, gradients and optimizer state of every model (policy, critic, reference, teacher)
        leave the training device for host copies until ``onload`` (offload.py; on CPU as well)."""
        self._offloader.offload()

    def onload(self) -> None:
        self._offloader.onload()

    def where(self):
        """offload.Where: bytes of the trained state on the device, and parked on the host."""
        return self._offloader.where()

    @property
    def offloaded(self) -> bool:
        """Whether the trained state is parked or dropped (offload_train), without counting its bytes as ``where``."""
        return self._offloader.offloaded

    def _state_tensors(self):
        critic = self.critic
        for module in (self.model, self.ref_model, getattr(self.teacher, "model", None), critic.module if critic else None):
            yield from module_tensors(module)
        for opt in (self.optimizer, critic.optimizer if critic else None):
            yield from optimizer_tensors(opt)

    def extra_modules(self) -> dict:
        """Modules besides the policy, by name, to save and restore with a checkpoint: {"critic": ...} with ppo (data
        parallel: as data_parallel.FullModule, full tensors); {"ref": ...} with ref_update_interval (the reference is no
        longer the initial model: a resume needs its weights)."""
        extras = {} if self.critic is None else {"critic": self.parallel.checkpoint_parts(self.critic.module, self.critic.optimizer)[0]}
        if self.algo.ref_update_interval and self.ref_model is not None:
            extras["ref"] = self.ref_model  # the same full copy on every rank
        return extras

    def extra_optimizers(self) -> dict:
        """Their optimizers, by the same names (data parallel: as data_parallel.FullOptimizer)."""
        if self.critic is None:
            return {}
        return {"critic": self.parallel.checkpoint_parts(self.critic.module, self.critic.optimizer)[1]}


class TorchTrainer(RLTrainer):
    """The RL step (rl_step.RLTrainer, not redefined here) over a TorchEngine built from these models."""

    def __init__(self, model, cfg: TrainConfig, pad_id: int, ref_model=None, teacher: Teacher | None = None, parallel=None,
                 lora=None, profiler: TrainProfiler | None = None):
        profiler = TrainProfiler.of(cfg) if profiler is None else profiler  # one for the step and the engine's loops
        engine = TorchEngine(model, cfg, pad_id, ref_model=ref_model, teacher=teacher, parallel=parallel, lora=lora, profiler=profiler)
        super().__init__(engine, cfg, profiler=profiler)


def merged_model(config, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A plain HF model of ``config`` holding the merged weights ``state`` (LoRA export)."""
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_config(config, dtype=next(iter(state.values())).dtype)
    plain.load_state_dict(state)
    return plain.eval()


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
    model.miles_compiled_layers = True  # attention per unit stays off: its spans change every step (unit_attention.py)


def _dropout_free(model) -> bool:
    """No dropout in train mode: no nn.Dropout with p > 0 and no attention/hidden dropout in the HF config."""
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return False
    config = getattr(model, "config", None)
    return not any(float(getattr(config, k, 0.0) or 0.0) > 0 for k in ("attention_dropout", "hidden_dropout", "dropout"))


def _fused_adam_ok(model) -> bool | None:
    """Fused AdamW (one kernel over all parameters) where torch has it for them; None = torch's default."""
    return True if all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in model.parameters()) else None

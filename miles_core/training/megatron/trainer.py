"""The Megatron backend: MegatronEngine (megatron-core's GPTModel, this rank's TP / PP / EP share, its DDP and
optimizer, its pipeline schedules; the TrainEngine protocol of training/engine.py) and MegatronTrainer, the
one RL step (training/rl_step.RLTrainer) over it, the same step as the torch backend's.

What the engine does for the step:
    forward-only log-probs of the policy, reference (KL) and OPD teacher (opd_teacher_load: a stage of the
    teacher's own shape), on the last pipeline stage, with log_softmax(logits / rollout_temperature),
    vocab-parallel under TP; the critic's values (ppo, critic.py)
    backward: this data-parallel rank's rows of a global batch in micro-batches (micro_batch_size samples, packed
    into one sequence with qkv_format thd or padded with bshd, or packed to max_tokens_per_gpu tokens with
    use_dynamic_batch_size: batching.py) through megatron's forward-backward
    schedule, the loss on the last stage; gradients and metric totals are sums over micro-batches and
    data-parallel ranks (the Reducer's global denominators)
    optimizer step: grad-norm clip clip_grad and Adam (optim.py), the NaN guard inside megatron's step.
Outputs (advantages, metrics) are those of the last pipeline stage, broadcast to every rank (from_last_stage).

With lora_rank > 0 the policy stage is the frozen base with LoRA adapters on its parallel linears (lora.py): the
optimizer holds the adapters, weight sync and the export get the merged weights (plus a PEFT adapter dir in the
export), checkpoints the adapters and the base's sha256.

megatron's calculate_per_token_loss is set on its TransformerConfig so that its schedule and DDP
neither divide the loss by the number of micro-batches nor average gradients over data-parallel ranks:
the Reducer's denominators already make the loss the step's mean (REFERENCE §3).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torch.utils.checkpoint

from miles_core.config import TrainConfig
from miles_core.config.rules import check_model_divides
from miles_core.device import resolve_device
from miles_core.models.shape import shape_from_config
from miles_core.training.batch import TokenBatch
from miles_core.training.disk import park_of
from miles_core.training.engine import LossFn, Piece, RolloutTensors
from miles_core.training.lora import LoraAdapters, base_checksum
from miles_core.training.offload import Offloader, Rematerialize, module_tensors, optimizer_tensors
from miles_core.training.rl_step import RLTrainer
from miles_core.training.schedule import reset_adam_state

from . import batching, checkpoint, logprobs, model, optim, parallel, weights
from .critic import MegatronCritic
from .hooks import MegatronHooks
from .logprobs import mask_padded_vocab
from .lora import MegatronLora
from .flops import fwd_flops
from .model_args import ModelArgs, from_hf_config
from .weights import load_hf_state  # every HF load checked against config.json first (checkpoint/hf_load.py)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class MegatronEngine:
    """Owns the policy stage (DDP-wrapped), its optimizer and the forward-only stages: reference (KL), teacher (OPD),
    and the critic (ppo)."""

    collective = True  # every method is a collective over the train group: a Ray train group calls it on every rank
    dropout_free = True  # hidden and attention dropout 0 (model.py); lora_dropout is refused at load

    def __init__(self, cfg: TrainConfig, model_path: Path, pad_id: int):
        self.cfg, self.algo, self.p = cfg, cfg.algo, cfg.parallel
        self.temperature = cfg.rollout.rollout_temperature
        self.pad_id = pad_id
        self.pad_to = self.p.tensor_model_parallel_size * self.p.data_pad_size_multiplier  # the reference's get_batch pad_size
        self.model_path = Path(model_path)
        hf_config = json.loads((self.model_path / "config.json").read_text())
        check_model_divides(shape_from_config(hf_config), self.p, str(self.model_path))
        self.args = from_hf_config(hf_config, str(self.model_path / "config.json"), cfg.checkpoint.model_name).padded_for(
            self.p.tensor_model_parallel_size, self.p.padded_vocab_size)
        # balance_by_flops: micro-batches weighed by estimated forward FLOPs (batching.flops_groups)
        self.workload = partial(fwd_flops, a=self.args) if self.p.balance_by_flops else None
        if self.p.megatron_to_hf_mode != "raw":  # refused at load (config/rules.py); weights.py is the raw converter
            raise ValueError(f"megatron_to_hf_mode {self.p.megatron_to_hf_mode}: only raw (weights.py) is implemented")
        self.device = resolve_device(cfg.cluster.device)  # batches, grad buffers and RNG live there
        self.device_type = self.device.type
        self.lora = self._lora(cfg)  # before any weight is read: its refusals name the field
        parallel.init_parallel(self.p, cfg.misc.seed, self.device_type)
        self.hooks = MegatronHooks(cfg)  # the reference's plugin hooks (hooks.py)
        self.hooks.init()
        # TE on CUDA when it imports, else local (model.py); LoRA's adapters wrap the local spec's linears (lora.py)
        self.spec = model.LAYER_SPECS["local"] if self.lora else model.layer_spec(self.device_type)
        self.share_prompts = self.spec.share_prompts(self.args)  # a packed group's prompt once (batching.packed)
        self.dtype = DTYPES[cfg.misc.dtype]
        self.tconfig = model.transformer_config(self.args, self.p, self.dtype, cpu=self.device_type == "cpu")
        self.tconfig.calculate_per_token_loss = True  # see the module docstring
        hf_state = load_hf_state(self.model_path, self.args)
        self.model, self.optimizer = self._build_policy(hf_state)
        self.critic = MegatronCritic(self, hf_state) if cfg.algo.advantage_estimator == "ppo" else None
        self.ref_model = self._build_ref() if cfg.needs_ref_model else None
        self.teacher_model = self._build_teacher() if cfg.algo.use_opd and cfg.algo.opd_teacher_load else None
        roles = (("ref", self.ref_model), ("teacher", self.teacher_model), ("critic", self.critic))
        self.roles = frozenset({"actor"} | {r for r, m in roles if m is not None})
        remat = None
        if cfg.parallel.rematerialize_param_from_master_weight:  # refused at load without fp32 main weights (rules.py)
            remat = Rematerialize(self._rematerialized, self._param_buffers, self._cast_main_to_params,
                                  check=cfg.parallel.check_rematerialize_param_from_master_weight)
        self._offloader = Offloader(self._state_tensors, self.device, park_of(cfg, self.device), remat)

    # ---- building ------------------------------------------------------------------------------
    def _stage(self, hf_state: dict[str, torch.Tensor], args: ModelArgs | None = None, tconfig=None):
        """A stage of the model ``args`` (default the policy's) under ``tconfig``, holding hf_state's weights."""
        args, tconfig = args or self.args, tconfig or self.tconfig
        stage = model.to_params_dtype(model.build_stage(args, tconfig, self.spec.use_transformer_engine), self.dtype)
        local = weights.shard(weights.hf_to_full(hf_state, args), stage)
        stage.load_state_dict({k: v.to(self.dtype) for k, v in local.items()}, strict=False)
        return stage

    def _lora(self, cfg: TrainConfig) -> MegatronLora | None:
        """The adapters of lora_rank > 0 (megatron/lora.py), or None; the models it does not build for refused by name
        (lora_dropout and sequence_parallel are refused at load: config/rules.py)."""
        if not cfg.lora.enabled:
            return None
        a, why = self.args, None
        if a.num_experts:
            why = f"an MoE model (num_experts {a.num_experts} in {self.model_path / 'config.json'}): adapters on the experts"
        elif a.multi_latent_attention:
            why = "multi-latent attention: adapters on its low-rank q/kv projections"
        if why:
            raise ValueError(f"lora_rank {cfg.lora.lora_rank} with train_backend megatron and {why} is not supported yet "
                             "(docs/decisions.md, LoRA); use train_backend torch")
        return MegatronLora(LoraAdapters(cfg.lora, cfg.checkpoint.hf_checkpoint), a, self.p.tensor_model_parallel_size)

    def _build_policy(self, hf_state):
        distributed = self.p.use_distributed_optimizer
        stage = self._stage(hf_state)
        if self.lora:  # the base loaded, then wrapped and frozen; the adapters from lora_adapter_path or a seeded init
            self.lora.adapters.base_sha256 = base_checksum(hf_state.items())
            self.lora.inject(stage)
            path = self.cfg.lora.lora_adapter_path
            self.lora.load(stage, self.lora.adapters.read_adapter(Path(path)) if path else self.lora.initial(self.cfg.misc.seed))
        ddp = optim.wrap_ddp(self.tconfig, stage, distributed_optimizer=distributed)
        self.params = [p for p in ddp.parameters() if p.requires_grad]
        return ddp, optim.build(ddp, self.params, self.algo, self.algo.lr, self.dtype, distributed, self.device_type)

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
        tconfig = model.transformer_config(args, self.p, self.dtype, cpu=self.device_type == "cpu")
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
        mbs = batching.plan(batch, list(range(len(batch))), self.algo.micro_batch_size, max_tokens, self.p.qkv_format,
                            self.pad_to, self.workload, share_prompts=self.share_prompts)
        return batching.forward_only(stage, batch, mbs, lambda mb, out: logprobs.token_log_probs(self._response_logits(mb, out), mb.resp_tokens))

    def forward_only(self, fn, batch: TokenBatch, samples: list) -> RolloutTensors:
        return fn(batch, samples)  # every rank runs every row (the data-parallel split is in the optimizer steps)

    def opd_topk_reverse_kl(self, batch: TokenBatch, samples: list, teacher=None) -> torch.Tensor:
        raise NotImplementedError("opd_log_prob_top_k needs the old policy's full distribution, which the megatron "
                                  "engine's vocab-parallel logits do not gather; use train_backend torch")

    def log_probs(self, role: str, batch: TokenBatch) -> torch.Tensor | None:
        stage = {"actor": self.model, "ref": self.ref_model, "teacher": self.teacher_model}[role]
        if stage is None:
            return None
        stage.eval()
        self.hooks.before_log_prob(role, stage)
        return self.compute_log_probs(stage, batch)

    def values(self, batch: TokenBatch) -> torch.Tensor | None:
        if self.critic is None:
            return None
        self.critic.module.eval()
        self.hooks.before_log_prob("critic", self.critic.module)
        return self.critic.values(batch)

    def actor_log_probs_and_entropy(self, batch: TokenBatch):
        """use_rollout_entropy is refused at load with train_backend megatron (miles_core/config/rules.py)."""
        raise NotImplementedError("use_rollout_entropy is not supported yet with train_backend megatron")

    @property
    def replays_step(self) -> bool:
        """The optimizer step's forward replays the old-policy pass (rl_step.on_policy) when one data-parallel rank
        trains every row: no dropout (dropout_free), the same micro-batches of the same weights, and the last pipeline
        stage, which holds the log-probs, fills logp_old for all of them. With several data-parallel ranks each would
        hold its own rows' only, so the old-policy pass runs."""
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_world_size() == 1

    @property
    def last_stage(self) -> bool:
        from megatron.core import parallel_state as ps

        return ps.is_pipeline_last_stage()

    def from_last_stage(self, obj):
        return parallel.from_last_stage(obj)

    def dump_module(self, role: str):
        """The stage of ``role`` whose passes are dumped (DDP-wrapped for actor and critic); None without one, and
        on a data-parallel rank but 0 (every tensor / pipeline rank of data-parallel rank 0 writes its own files)."""
        from megatron.core import parallel_state as ps

        if ps.get_data_parallel_rank() != 0:
            return None
        critic = None if self.critic is None else self.critic.module
        return {"actor": self.model, "ref": self.ref_model, "teacher": self.teacher_model, "critic": critic}[role]

    def dump_ranks(self) -> dict:
        """rank, world_size and megatron_parallel_info (the ranks and sizes SGLang's comparator unshards by)."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        info = {"tp_rank": ps.get_tensor_model_parallel_rank(), "tp_size": ps.get_tensor_model_parallel_world_size(),
                "pp_rank": ps.get_pipeline_model_parallel_rank(), "pp_size": ps.get_pipeline_model_parallel_world_size(),
                "dp_rank": ps.get_data_parallel_rank(), "dp_size": ps.get_data_parallel_world_size(),
                "cp_rank": ps.get_context_parallel_rank(), "cp_size": ps.get_context_parallel_world_size(),
                "ep_rank": ps.get_expert_model_parallel_rank(), "ep_size": ps.get_expert_model_parallel_world_size()}
        return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "parallel_info": {"megatron": info}}

    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    # ---- backward and optimizer step --------------------------------------------------------------
    def _trained_parts(self, model: str):
        """(DDP module, optimizer, params) of "actor" or "critic"."""
        if model == "actor":
            return self.model, self.optimizer, self.params
        return self.critic.module, self.critic.optimizer, self.critic.params

    def backward(self, model: str, batch: TokenBatch, rows: range, loss_fn: LossFn) -> dict[str, float]:
        """Gradients of loss_fn over this data-parallel rank's share of rows (megatron's schedule, loss on the last
        stage); -> the metric totals summed over micro-batches and data-parallel ranks."""
        ddp, optimizer, _ = self._trained_parts(model)
        max_tokens = self.p.max_tokens_per_gpu if self.p.use_dynamic_batch_size else None
        mbs = batching.plan(batch, parallel.my_rows(rows), self.algo.micro_batch_size, max_tokens, self.p.qkv_format,
                            self.pad_to, self.workload, share_prompts=self.share_prompts)
        ddp.train()
        ddp.zero_grad_buffer()
        optimizer.zero_grad(set_to_none=True)
        self.hooks.before_train_step(rows.start // len(rows), ddp, optimizer)  # step k of the rollout: rows k*gbs..
        piece = self._actor_piece if model == "actor" else self._critic_piece
        totals: dict[str, float] = {}
        for r in batching.run(ddp, mbs, partial(self._loss, loss_fn, piece), forward_only=False):
            for name, v in r.items():
                totals[name] = totals.get(name, 0.0) + v
        return parallel.sum_over_data_parallel(totals)

    def _loss(self, loss_fn: LossFn, piece, mb: batching.MicroBatch, out: torch.Tensor):
        """loss_fn on one micro-batch (last stage): -> (loss, token count, float metrics), as megatron's schedule wants.
        recompute_loss_function: the loss from the stage's output on (log-softmax over the vocab, entropy, loss terms)
        runs under activation checkpointing, its activations recomputed in the backward (the reference's
        training_utils/loss.py loss_function)."""
        if self.p.recompute_loss_function:
            loss, metrics = torch.utils.checkpoint.checkpoint(lambda o: loss_fn(piece(mb, o)), out, use_reentrant=False)
        else:
            loss, metrics = loss_fn(piece(mb, out))
        return loss, batching.count(loss), {name: float(v) for name, v in metrics.items()}

    def _actor_piece(self, mb: batching.MicroBatch, out: torch.Tensor) -> Piece:
        logits = self._response_logits(mb, out)
        entropy = logprobs.entropy(logits if self.algo.entropy_coef > 0 else logits.detach()) if self.algo.train_entropy else None
        return Piece(rows=mb.rows, loss_mask=mb.loss_mask, rollout_log_probs=mb.rollout_log_probs,
                     log_probs=logprobs.token_log_probs(logits, mb.resp_tokens), entropy=entropy)

    def _critic_piece(self, mb: batching.MicroBatch, out: torch.Tensor) -> Piece:
        return Piece(rows=mb.rows, loss_mask=mb.loss_mask, rollout_log_probs=mb.rollout_log_probs,
                     values=self.critic.response_values(mb, out))

    def start_rollout(self, rollout_id: int) -> None:
        self.hooks.rollout_id = rollout_id  # the before-train-step hook's rollout_id

    def reset_optimizer_states(self) -> None:
        """reset_optimizer_states: a fresh Adam state for the actor and the critic (megatron-core's inner AdamW)."""
        for optimizer in (self.optimizer, *([] if self.critic is None else [self.critic.optimizer])):
            reset_adam_state(optimizer)

    def update_ref(self) -> None:
        """ref_update_interval is refused at load with train_backend megatron (miles_core/config/rules.py): the
        reference is a forward-only stage with no update path, nor a place in the torch_dist checkpoint, yet."""
        raise NotImplementedError("ref_update_interval is not supported yet with train_backend megatron")

    def optimizer_step(self, model: str, lr: float, check) -> float:
        """lr on every param group, then optim.step: the clip, ``check(grad_norm)`` (inside megatron's step for its
        optimizer) and the update; -> the grad norm."""
        _, optimizer, params = self._trained_parts(model)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return optim.step(optimizer, params, self.algo.clip_grad, check)

    # ---- weights ------------------------------------------------------------------------------
    def hf_state(self) -> dict[str, torch.Tensor]:
        """The whole policy in HF names (TP/PP/EP shards gathered; every rank gets it)."""
        hf = weights.full_to_hf(weights.gather_full(self.model.module), self.args)
        if self.lora:  # the engines and the merged export get W + s B A under the base's names
            hf = self.lora.merged(hf, self.lora.gather(self.model.module))
        if not self.args.untie_embeddings_and_output_weights:
            hf["lm_head.weight"] = hf["model.embed_tokens.weight"]  # as the tied HF model's state dict has it
        return hf

    def named_tensors(self):
        """HF names and tensors in the model dtype, for weight sync (the fp32 main weights stay in the optimizer)."""
        return [(k, v.to(self.dtype) if v.is_floating_point() else v) for k, v in self.hf_state().items()]

    def hf_model(self):
        """The policy as a transformers model (CPU, in the model dtype) holding the gathered weights."""
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_config(self.hf_config(), dtype=self.dtype)
        hf.load_state_dict(self.hf_state())
        return hf.eval()

    def export(self, export_dir: Path, rollout_id: int, tokenizer) -> Path:
        """An HF snapshot <export_dir>/<rollout_id>/ (checkpoint.export.export_hf), written by rank 0; collective."""
        from miles_core.checkpoint.export import export_hf

        hf = self.hf_model()  # every rank takes part in the gather
        adapter = None
        if self.lora:  # the PEFT adapter in adapter/, beside the merged model (the torch trainer's export)
            tensors = self.lora.gather(self.model.module)
            adapter = lambda tmp: self.lora.adapters.write_adapter(tensors, tmp / "adapter", self.dtype)  # noqa: E731
        path = Path(export_dir) / str(rollout_id)
        if dist.get_rank() == 0:
            path = export_hf(hf, tokenizer, export_dir, rollout_id, extra=adapter)
        dist.barrier()
        return path

    def hf_config(self):
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(self.model_path)

    def save(self, save_dir: Path, rollout_id: int, state: dict) -> None:
        """An atomic torch_dist checkpoint (checkpoint.py) holding ``state`` (with steps_done); collective over the train group."""
        path = checkpoint.save(self, save_dir, rollout_id, state)
        if dist.get_rank() == 0:
            self.hooks.post_save(rollout_id, path)

    def restore(self, load_dir: Path) -> dict | None:
        return checkpoint.restore(self, load_dir)

    def wait_saves(self) -> None:
        """Saves are synchronous here (async_save is refused with train_backend megatron)."""

    def run_params(self) -> dict[str, str]:
        """What this trainer chose from the config and the machine, for the run's params (derived.trainer.*)."""
        return {"layer_spec": self.spec.name, "device": self.device_type, "optimizer": type(self.optimizer).__name__,
                "megatron_to_hf_mode": self.p.megatron_to_hf_mode,
                "main_dtype": "float32" if self.dtype in optim.HALF else str(self.dtype).removeprefix("torch.")}

    def offload(self) -> None:
        """offload_train: every stage's weights, DDP grad (and param) buffers and optimizer state (fp32 main weights,
        moments) leave the training device for host copies until ``onload`` (training/offload.py; on CPU as well)."""
        self._offloader.offload()

    def onload(self) -> None:
        """The parked state back; with rematerialize_param_from_master_weight the 16-bit weights of the policy (and
        critic) rebuilt from their fp32 main weights instead (training/offload.py)."""
        self._offloader.onload()

    def _trained(self):
        """(DDP stage, its megatron-core optimizer) of each model the trainer steps: the policy, the ppo critic."""
        yield self.model, self.optimizer
        if self.critic is not None:
            yield self.critic.module, self.critic.optimizer

    def _rematerialized(self):
        """rematerialize_param_from_master_weight: (name, parameter) of every 16-bit parameter that has its own fp32
        main weights in the optimizer, in the stage's order, named actor:<name> or critic:<name>."""
        for role, (ddp, optimizer) in zip(("actor", "critic"), self._trained()):
            mained = {id(param) for param, main in optim.main_params(optimizer) if main is not param}
            for name, param in ddp.named_parameters():
                if param.dtype in optim.HALF and id(param) in mained:
                    yield f"{role}:{name}", param

    def _param_buffers(self):
        """megatron DDP's param buffers (the distributed optimizer's): views of the 16-bit parameters only."""
        for ddp, _ in self._trained():
            for buffer in optim.grad_buffers(ddp):
                data = getattr(buffer, "param_data", None)
                if data is not None and data.dtype in optim.HALF:
                    yield data

    @torch.no_grad()
    def _cast_main_to_params(self) -> None:
        """The end of megatron-core's optimizer step again: the fp32 main weights cast into the 16-bit parameters
        (_copy_main_params_to_model_params), and with the distributed optimizer each rank's shard all-gathered into
        every rank's param buffer (DDP.start_param_sync), as the reference's rematerialize does."""
        for ddp, optimizer in self._trained():
            for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
                opt._copy_main_params_to_model_params()
            if self.p.use_distributed_optimizer:
                ddp.start_param_sync(force_sync=True)

    def where(self):
        """offload.Where: bytes of the trained state on the device, and parked on the host."""
        return self._offloader.where()

    @property
    def offloaded(self) -> bool:
        """Whether the trained state is parked or dropped (offload_train), without counting its bytes as ``where``."""
        return self._offloader.offloaded

    def _state_tensors(self):
        critic = self.critic
        for module in (self.model, self.ref_model, self.teacher_model, critic.module if critic else None):
            yield from module_tensors(module)
            for buffer in optim.grad_buffers(module):
                yield from (t for t in (buffer.grad_data, getattr(buffer, "param_data", None)) if t is not None)
        for opt in (self.optimizer, critic.optimizer if critic else None):
            yield from optimizer_tensors(opt)

    def close(self) -> None:
        """Destroy megatron's process groups (and the one-rank world if the trainer started it)."""
        parallel.teardown()



class MegatronTrainer(RLTrainer):
    """The RL step (rl_step.RLTrainer, not redefined here) over a MegatronEngine."""

    def __init__(self, cfg: TrainConfig, model_path: Path, pad_id: int):
        super().__init__(MegatronEngine(cfg, model_path, pad_id), cfg)

    def close(self) -> None:
        self.engine.close()

"""The local runtime: engine, trainer, data source and tokenizer of one run, in this process.

Each stage method is what one Prefect task calls. Stages take plain values (rollout id) and
return small dicts of metrics; the live objects stay here, looked up by run key (registry.py).
"""

from __future__ import annotations

import contextlib
import copy
import time
from pathlib import Path

import torch

from miles_core import checkpoint as ckpt
from miles_core.config import TrainConfig
from miles_core.data import DataSource, Sample, load_prompts
from miles_core.env import cache_dir
from miles_core.evaluation import SnapshotEvaluator, build_suite, load_hf_engine, run_on_engine
from miles_core.models import resolve_model_path
from miles_core.rewards import reward_value
from miles_core.rollout.fully_async import FullyAsyncWorker
from miles_core.rollout.generate import Rollout, RolloutSpec, generate_rollout
from miles_core.rollout.hf_engine import HFEngine
from miles_core.rollout.metrics import rollout_metrics, staleness_metrics
from miles_core.rollout.multi_turn import conversation_columns, turn_spec
from miles_core.specs import prompt_spec, resolve_data_path, reward_options, sampling_params
from miles_core.training.teacher import load_teacher
from miles_core.training.torch_trainer import TorchTrainer
from miles_core.weights.sync import sync_weights

class LocalRuntime:
    def __init__(self, cfg: TrainConfig):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg = cfg
        if cfg.cluster.num_threads:
            torch.set_num_threads(cfg.cluster.num_threads)
        self.model_path = resolve_model_path(cfg.checkpoint.hf_checkpoint, cache_dir())
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        prompts, self.dropped_prompts = load_prompts(resolve_data_path(cfg.data.prompt_data), self.tokenizer, prompt_spec(cfg))
        self.num_prompts = len(prompts)
        self.source = DataSource(prompts, shuffle=cfg.data.rollout_shuffle, seed=cfg.data.rollout_seed)
        self.eval_suite = build_suite(cfg, self.tokenizer)  # bad eval data or eval_config fails here, before any model loads
        self._snapshot_evals: SnapshotEvaluator | None = None
        torch.manual_seed(cfg.misc.seed)
        dtype = getattr(torch, cfg.misc.dtype)
        policy = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype)
        ref = None
        if cfg.needs_ref_model:
            ref_path = resolve_model_path(cfg.checkpoint.ref_load, cache_dir()) if cfg.checkpoint.ref_load else self.model_path
            ref = AutoModelForCausalLM.from_pretrained(ref_path, dtype=dtype).eval()
        teacher = load_teacher(cfg, dtype, policy.config.vocab_size, make_engine=lambda m: HFEngine(m, self.tokenizer))
        self.trainer = TorchTrainer(policy, cfg, pad_id=self.tokenizer.pad_token_id, ref_model=ref, teacher=teacher)
        self.engine = HFEngine(copy.deepcopy(policy), self.tokenizer)
        self.params = sampling_params(cfg, self.tokenizer.eos_token_id)
        self.rewards = reward_options(cfg)
        self.weight_version = 0
        self._async_worker: FullyAsyncWorker | None = None
        self._taken: dict[int, tuple[list, dict]] = {}  # fully async: groups taken per rollout id (a retried task reuses them)
        self._accept_rollout: int | None = None  # one_step resume: the prefetched rollout file the checkpoint counts on

    @property
    def num_rollout(self) -> int:
        c = self.cfg
        return c.rollout.num_rollout or max(1, self.num_prompts // c.rollout.rollout_batch_size * c.data.num_epoch)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # ---- stages ---------------------------------------------------------------------------------
    def rollout_path(self, rollout_id: int) -> Path:
        return self.cfg.run_dir / "rollouts" / f"{rollout_id}.pt"

    def rollout_spec(self) -> RolloutSpec:
        r = self.cfg.rollout
        return RolloutSpec(r.rollout_batch_size, r.n_samples_per_prompt, self.params, r.rollout_max_context_len,
                           r.over_sampling_batch_size, r.dynamic_sampling_filter_path, r.reward_key, self.cfg.misc.seed,
                           r.partial_rollout, turns=turn_spec(self.cfg, self.model_path))

    def generate(self, rollout_id: int) -> dict[str, float]:
        """Generate and score rollout ``rollout_id``, written atomically; reused if it exists for this weight version
        (or, after a one_step resume, if it is the prefetched rollout the checkpoint counts on)."""
        path = self.rollout_path(rollout_id)
        fully = self.cfg.rollout.async_mode == "fully"
        if path.exists() and not fully:  # fully async: the checkpointed buffer, not a file, says what is left to train on
            saved = torch.load(path, weights_only=False)
            if saved["weight_version"] == self.weight_version or rollout_id == self._accept_rollout:
                self.source.load_state_dict(saved["cursor_after"])
                return saved["metrics"]
        t0 = time.perf_counter()
        r = self.cfg.rollout
        if fully:
            if rollout_id not in self._taken:
                self._taken = {rollout_id: self.fully_async_worker().take(r.rollout_batch_size, rollout_id)}
            groups, async_metrics = self._taken[rollout_id]
            rollout = Rollout(rollout_id, [s for g in groups for s in g], dict(async_metrics))
            version = self.weight_version
        else:
            version = self.weight_version
            rollout = generate_rollout(self.engine, self.source, self.rollout_spec(), self.rewards, rollout_id, self.decode)
        dt = time.perf_counter() - t0
        rewards = [reward_value(s.reward, r.reward_key) for s in rollout.samples]
        metrics = {**rollout.metrics, **rollout_metrics(rollout.samples, rewards, r.n_samples_per_prompt)}
        tokens = sum(len(s.tokens) for s in rollout.samples)
        metrics |= {"perf/rollout_time": dt, "perf/tokens_per_gpu_per_sec": tokens / max(dt, 1e-9)}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save({"samples": [s.to_dict() for s in rollout.samples], "metrics": metrics, "weight_version": version,
                    "cursor_after": self.source.state_dict()}, tmp)
        tmp.replace(path)
        return metrics

    def load_rollout(self, rollout_id: int) -> list[Sample]:
        saved = torch.load(self.rollout_path(rollout_id), weights_only=False)
        return [Sample.from_dict(d) for d in saved["samples"]]

    def sample_rows(self, rollout_id: int, n: int) -> list[dict]:
        """The first n samples of a rollout as table rows (for the tracker); log_multi_turn adds the conversations."""
        conversation = (lambda s: conversation_columns(s, self.tokenizer)) if self.cfg.tracking.log_multi_turn else (lambda s: {})
        return [
            {"rollout_id": rollout_id, "group_index": s.group_index, "prompt": str(s.prompt), "response": s.response,
             "label": str(s.label), "reward": reward_value(s.reward, self.cfg.rollout.reward_key), "status": s.status.value,
             "weight_version": s.weight_versions[0], **conversation(s)}
            for s in self.load_rollout(rollout_id)[:n]
        ]

    def train(self, rollout_id: int) -> tuple[dict[str, float], list[dict[str, float]]]:
        samples = self.load_rollout(rollout_id)
        rewards = [reward_value(s.reward, self.cfg.rollout.reward_key) for s in samples]
        rollout, steps = self.trainer.train_rollout(samples, rewards, rollout_id)
        return rollout | staleness_metrics(samples, self.weight_version), steps

    # ---- async --------------------------------------------------------------------------------------
    def fully_async_worker(self) -> FullyAsyncWorker:
        """async_mode fully: the background generator (created here, started at the first take)."""
        if self._async_worker is None:
            r = self.cfg.rollout
            self._async_worker = FullyAsyncWorker(
                self.engine, self.source, self.rollout_spec(), self.rewards, self.decode, lambda: self.weight_version,
                capacity=r.fully_async_buffer_groups or 2 * r.rollout_batch_size, max_staleness=r.max_weight_staleness,
                policy=r.stale_group_policy)
        return self._async_worker

    def paused(self) -> contextlib.AbstractContextManager:
        """No background generation inside (weight sync, save, inline eval); a no-op unless async_mode is fully."""
        return self._async_worker.paused() if self._async_worker is not None else contextlib.nullcontext()

    def close(self) -> None:
        if self._async_worker is not None:
            self._async_worker.stop()

    def sync_weights(self) -> dict[str, float]:
        with self.paused():
            self.weight_version += 1
            return sync_weights(self.trainer.named_tensors(), [self.engine], self.weight_version, self.cfg.cluster.update_weight_buffer_size)

    def evaluate(self) -> tuple[dict[str, float], list[dict]]:
        """Inline eval of the live engine, pinned to the current weight version (a point that cannot run
        gives eval/skipped_<reason>)."""
        with self.paused():
            result = run_on_engine(self.engine, self.eval_suite, self.weight_version)
        return result.metrics, result.rows

    def snapshot_evals(self) -> SnapshotEvaluator:
        """eval_mode snapshot: background evals of HF snapshots in <run_dir>/eval_snapshots/<weight version>/."""
        if self._snapshot_evals is None:
            e = self.cfg.eval
            export = lambda root, version: ckpt.export_hf(self.trainer.model, self.tokenizer, root, version)  # noqa: E731
            load = lambda path, version: load_hf_engine(path, version, self.cfg.misc.dtype)  # noqa: E731
            self._snapshot_evals = SnapshotEvaluator(self.eval_suite, self.cfg.run_dir / "eval_snapshots", export, load,
                                                     e.eval_max_in_flight, e.eval_overflow_policy, e.eval_keep_snapshots,
                                                     version_now=lambda: self.weight_version)
        return self._snapshot_evals

    # ---- checkpoints ---------------------------------------------------------------------------
    def save(self, rollout_id: int, state: dict) -> dict[str, float]:
        t0 = time.perf_counter()
        with self.paused():
            state = {**state, "data_source": self.source.state_dict(), "weight_version": self.weight_version,
                     "steps_done": self.trainer.steps_done, **self.async_state()}
            ckpt.save_checkpoint(self.cfg.save_dir, rollout_id, model=self.trainer.model, optimizer=self.trainer.optimizer,
                                 state=state, keep_last=self.cfg.checkpoint.keep_last, save_optim=not self.cfg.checkpoint.no_save_optim,
                                 extra_tensors=self.trainer.extra_modules() or None,
                                 extra_optimizers=self.trainer.extra_optimizers() or None)
        return {"perf/save_model_time": time.perf_counter() - t0}

    def async_state(self) -> dict:
        """The async part of a checkpoint: the fully-async buffer (call inside paused())."""
        return {"async_buffer": self._async_worker.state_dict()} if self._async_worker is not None else {}

    def restore_async(self, meta: dict) -> None:
        mode = self.cfg.rollout.async_mode
        if mode == "one_step":  # rollout i+1 was generated (before training on i) and written before checkpoint i
            self._accept_rollout = meta["rollout_id"] + 1
        elif mode == "fully" and "async_buffer" in meta:
            self.fully_async_worker().load_state_dict(meta["async_buffer"])

    def restore(self) -> dict | None:
        """Load the latest complete checkpoint of load_dir into trainer and engine; -> its meta, or None."""
        info = ckpt.find_latest(self.cfg.load_dir)
        if info is None:
            return None
        meta = ckpt.load_checkpoint(info, model=self.trainer.model, optimizer=self.trainer.optimizer,
                                    extra_modules=self.trainer.extra_modules() or None,
                                    extra_optimizers=self.trainer.extra_optimizers() or None)
        self.source.load_state_dict(meta["data_source"])
        self.trainer.steps_done = meta["steps_done"]
        self.weight_version = meta["weight_version"]
        self.restore_async(meta)
        self.sync_weights()  # the sync that followed this save in the interrupted run (version + 1)
        return meta

    def export(self, rollout_id: int) -> Path:
        return ckpt.export_hf(self.trainer.model, self.tokenizer, self.cfg.export_dir, rollout_id)

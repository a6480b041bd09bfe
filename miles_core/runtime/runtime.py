"""The Runtime: the stage logic of a run, once, over the parts a placement built (ARCHITECTURE.md).

    trainer   a Trainer (training/protocol.py): the torch trainer in process, or a Ray train group
    fleet     an EngineFleet (rollout/fleet.py): one in-process HF engine, or a router over HTTP engines
    weights   the trainer's side of a weight sync (a WeightSender, or train rank 0's proxy)

Each stage method is what one Prefect task calls (tasks/stages.py). Stages take plain values (a rollout
id) and return small typed results; the live objects stay here, looked up by run key (registry.py).
The driver side (this object, in the flow's process) keeps tokenizer, data source, rewards, sampling
parameters and rollout files, whatever the placement.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from miles_core import checkpoint as ckpt
from miles_core.config import TrainConfig
from miles_core.data import DataSource, Sample
from miles_core.evaluation import EvalSuite, PointResult, SnapshotEvaluator, load_hf_engine, run_on_engine
from miles_core.rollout.dumper import configure_engines
from miles_core.rewards import RewardOptions, reward_value
from miles_core.rollout.fleet import EngineFleet, WeightSource
from miles_core.rollout.custom_rollout import RolloutDataSourceWithBuffer, RolloutFunction, make_data_source, run_rollout_function
from miles_core.rollout.fully_async import FullyAsyncWorker
from miles_core.rollout.generate import Rollout, RolloutSpec, generate_rollout
from miles_core.resolve import reference_args, resolve
from miles_core.rollout.metrics import generation_perf_metrics, reward_category_metrics, rollout_metrics, staleness_metrics
from miles_core.rollout.multi_turn import conversation_columns, turn_spec
from miles_core.rollout.multi_turn.spec import reference_args as flat_reference_args
from miles_core.rollout.protocol import SamplingParams
from miles_core.tracking.samples import sample_rows
from miles_core.training.protocol import Trainer, TrainOutput

from . import ci_checks, debug_data
from .rollout_store import RolloutFile, RolloutStore
from .run_events import RunEvents


@dataclass
class RunData:
    """The driver's side of a run, built from the config before any model loads (except the tokenizer)."""

    model_path: Path
    tokenizer: object
    source: DataSource
    num_prompts: int
    dropped_prompts: int
    context_len: int | None  # rollout_max_context_len, else the model's max_position_embeddings (specs.context_len)
    eval_suite: EvalSuite
    params: SamplingParams
    rewards: RewardOptions


@dataclass
class RunParts:
    """What a placement builds: the trainer, the engine fleet, the trainer's side of a weight sync, and
    ``close`` for what the placement itself holds (a placement group, a Ray session)."""

    trainer: Trainer
    fleet: EngineFleet
    weights: WeightSource
    close: list = field(default_factory=list)


class Runtime:
    def __init__(self, cfg: TrainConfig, data: RunData, parts: RunParts):
        self.cfg, self.data = cfg, data
        self.trainer, self.fleet, self.weights = parts.trainer, parts.fleet, parts.weights
        self._closers = parts.close
        self.rollouts = RolloutStore(cfg.run_dir / "rollouts", cfg.checkpoint.keep_rollouts)
        self.weight_version = 0
        self._snapshot_evals: SnapshotEvaluator | None = None
        self._async_worker: FullyAsyncWorker | None = None
        self._taken: dict[int, tuple[list, dict]] = {}  # fully async: groups taken per rollout id (a retried task reuses them)
        self._accept_rollout: int | None = None  # one_step resume: the prefetched rollout file the checkpoint counts on
        self._reference_source = None  # the data source in the reference's interface (custom_rollout.py), built when first used
        self._rollout_fn: RolloutFunction | None = None
        m = cfg.misc
        self.metric_checker = (ci_checks.MetricChecker(m.ci_metric_checker_key, m.ci_metric_checker_threshold)
                               if m.ci_test and m.ci_metric_checker_key is not None else None)
        self.last_trained: int | None = None  # the last rollout trained on (or restored): an eval's rollout id
        self._offloads_trainer, self._trainer_offloaded = cfg.offloads_trainer, False
        self._unpruned: int | None = None  # the rollout of a checkpoint still being written (async_save)
        self.events = RunEvents(cfg)  # save_debug_event_data (run_events.py); does nothing without an event dir

    # ---- facts --------------------------------------------------------------------------------------
    @property
    def model_path(self) -> Path:
        return self.data.model_path

    @property
    def tokenizer(self):
        return self.data.tokenizer

    @property
    def source(self) -> DataSource:
        return self.data.source

    def reference_source(self):
        """The data source a rollout_function_path or rollout_all_samples_process_path function gets (data_source_path)."""
        if self._reference_source is None:
            c = self.cfg
            self._reference_source = make_data_source(c.data.data_source_path, self.source, c.rollout.n_samples_per_prompt,
                                                      not c.data.disable_rollout_global_dataset, self.reference_args())
        return self._reference_source

    def reference_args(self):
        """A custom function's ``args``: the config under the reference's names, save / load the run's checkpoint dirs."""
        args = reference_args(**flat_reference_args(self.cfg))
        args.save, args.load = str(self.cfg.save_dir), str(self.cfg.load_dir)
        return args

    @property
    def engine(self):
        """The RolloutEngine the stages generate with (the fleet's)."""
        return self.fleet.engine

    def engine_urls(self) -> list[str]:
        """The base URLs of the fleet's HTTP engines now (the dashboard scrapes their /metrics); none in process."""
        from miles_core.rollout.http import HTTPFleet

        return [s.url for s in self.fleet.router.slots] if isinstance(self.fleet, HTTPFleet) else []

    @property
    def num_prompts(self) -> int:
        return self.data.num_prompts

    @property
    def dropped_prompts(self) -> int:
        return self.data.dropped_prompts

    @property
    def num_rollout(self) -> int:
        c = self.cfg
        return c.rollout.num_rollout or max(1, self.num_prompts // c.rollout.rollout_batch_size * c.data.num_epoch)

    def decode(self, ids: list[int]) -> str:
        """A response's text as SGLang returns it for the rollout's sampling params (rollout_skip_special_tokens)."""
        from miles_core.rollout.http.wire import response_text

        return response_text(self.tokenizer, ids, self.data.params)

    def rollout_spec(self) -> RolloutSpec:
        r = self.cfg.rollout
        return RolloutSpec(rollout_batch_size=r.rollout_batch_size, n_samples_per_prompt=r.n_samples_per_prompt,
                           params=self.data.params, max_context_len=self.data.context_len,
                           over_sampling_batch_size=r.over_sampling_batch_size, filter_path=r.dynamic_sampling_filter_path,
                           reward_key=r.reward_key, seed=self.cfg.misc.seed, partial_rollout=r.partial_rollout,
                           mask_offpolicy=r.mask_offpolicy_in_partial_rollout,
                           turns=turn_spec(self.cfg, self.model_path))

    # ---- 2. generate -------------------------------------------------------------------------------
    def generate(self, rollout_id: int) -> dict[str, float]:
        """Generate and score rollout ``rollout_id``, written atomically; reused if it exists for this weight
        version (or, after a one_step resume, if it is the prefetched rollout the checkpoint counts on). A
        failed attempt leaves the data cursor and buffer as they were, so a retry draws the same prompts."""
        fully = self.cfg.rollout.async_mode == "fully"
        self.offload_trainer()  # offload_train: the engines generate without the trainer on the device
        if self.rollouts.exists(rollout_id) and not fully:  # fully async: the checkpointed buffer says what is left
            saved = self.rollouts.read(rollout_id)
            if saved.weight_version == self.weight_version or rollout_id == self._accept_rollout:
                self.source.load_state_dict(saved.cursor_after)
                return saved.metrics
        before = self.source.state_dict()
        try:
            return self._generate_new(rollout_id, fully)
        except BaseException:
            self.source.load_state_dict(before)
            raise

    def _generate_new(self, rollout_id: int, fully: bool) -> dict[str, float]:
        t0 = time.perf_counter()
        r = self.cfg.rollout
        version = self.weight_version
        if fully:
            if rollout_id not in self._taken:
                self._taken = {rollout_id: self.fully_async_worker().take(r.rollout_batch_size, rollout_id)}
            groups, async_metrics = self._taken[rollout_id]
            rollout = Rollout(rollout_id, [s for g in groups for s in g], dict(async_metrics))
        elif self.cfg.misc.train_only:
            rollout = Rollout(rollout_id, self._recorded(rollout_id))
        elif r.rollout_function_path is not None:
            configure_engines(self.cfg, self.engine)  # dumper_inference: this rollout's engine dumps
            if self._rollout_fn is None:
                self._rollout_fn = RolloutFunction(r.rollout_function_path, self.reference_args(), self.reference_source())
            rollout = run_rollout_function(self._rollout_fn, self.engine, self.tokenizer, self.rollout_spec(), self.data.rewards,
                                           rollout_id, version, self.decode)
            rollout = self._maybe_inject(rollout)
        else:
            configure_engines(self.cfg, self.engine)
            rollout = generate_rollout(self.engine, self.source, self.rollout_spec(), self.data.rewards, rollout_id, self.decode)
            rollout = self._maybe_inject(rollout)
        dt = time.perf_counter() - t0
        if r.rollout_sample_filter_path is not None:
            self._filter_samples(rollout.samples)
        if r.rollout_all_samples_process_path is not None and rollout.examined:
            fn = resolve(r.rollout_all_samples_process_path, what="rollout_all_samples_process_path")
            fn(self.reference_args(), rollout.examined, self.reference_source())
        m = self.cfg.misc
        if m.rollout_dump is not None:
            debug_data.save_rollout(m.rollout_dump, rollout.samples, rollout_id, m.trajectory_dump)
        metrics = self._generation_metrics(rollout, dt)
        self.rollouts.write(rollout_id, RolloutFile(samples=rollout.samples, metrics=metrics, weight_version=version,
                                                    cursor_after=self.source.state_dict()))
        self.events.rollout(rollout_id, version, len(rollout.samples), metrics)
        return metrics

    def _recorded(self, rollout_id: int) -> list[Sample]:
        """load_debug_rollout_data: the recorded samples of ``rollout_id`` (subsampled), as many as a rollout trains on."""
        m = self.cfg.misc
        samples = debug_data.load_rollout(m.load_debug_rollout_data, rollout_id, m.load_debug_rollout_data_subsample)
        if len(samples) != self.cfg.n_samples:
            raise ValueError(f"load_debug_rollout_data: rollout {rollout_id} holds {len(samples)} samples (after "
                             f"load_debug_rollout_data_subsample {m.load_debug_rollout_data_subsample}), the config trains on "
                             f"rollout_batch_size * n_samples_per_prompt = {self.cfg.n_samples}; set those to match the recording")
        return samples

    def _maybe_inject(self, rollout: Rollout) -> Rollout:
        """ci_inject_rollout_data_*: from the start rollout on, the generated batch is checked against the recording and
        replaced by it (its generation metrics dropped, as the reference's)."""
        m = self.cfg.misc
        if m.ci_inject_rollout_data_path is None or rollout.rollout_id < m.ci_inject_rollout_data_start_rollout_id:
            return rollout
        injected = debug_data.load_rollout(m.ci_inject_rollout_data_path, rollout.rollout_id)
        debug_data.check_injection(rollout.samples, injected, rollout.rollout_id, m.ci_inject_rollout_data_min_match_ratio)
        return Rollout(rollout.rollout_id, injected)
    def _filter_samples(self, samples: list[Sample]) -> None:
        """rollout_sample_filter_path, the reference's fn(args, data) over the rollout's groups: a sample it marks
        remove_sample gets loss mask 0, as the reference's train-data conversion (miles/ray/rollout/train_data_conversion.py)."""
        G = self.cfg.rollout.n_samples_per_prompt
        fn = resolve(self.cfg.rollout.rollout_sample_filter_path, what="rollout_sample_filter_path")
        fn(reference_args(**flat_reference_args(self.cfg)), [samples[i : i + G] for i in range(0, len(samples), G)])
        for s in samples:
            if s.remove_sample:
                s.loss_mask = [0] * s.response_length

    def _generation_metrics(self, rollout: Rollout, seconds: float) -> dict[str, float]:
        """The reference's log_rollout_data: custom_rollout_log_function_path first (True: none of the rest), then
        the extra metrics of the rollout, rollout/* of the samples (error_cat with log_reward_category), perf/*."""
        c, r = self.cfg, self.cfg.rollout
        if r.custom_rollout_log_function_path is not None:
            custom = resolve(r.custom_rollout_log_function_path, what="custom_rollout_log_function_path")
            if custom(rollout.rollout_id, reference_args(**flat_reference_args(c)), rollout.samples, rollout.metrics, seconds):
                return {}
        rewards = [reward_value(s.reward, r.reward_key) for s in rollout.samples]
        metrics = {**rollout.metrics, **rollout_metrics(rollout.samples, rewards, r.n_samples_per_prompt, c.algo,
                                                            passrate=c.tracking.log_passrate)}
        if c.tracking.log_reward_category is not None:
            metrics |= reward_category_metrics(rollout.samples, c.tracking.log_reward_category)
        return metrics | generation_perf_metrics(rollout.samples, seconds, num_gpus=c.cluster.rollout_num_gpus or 1)

    def load_rollout(self, rollout_id: int) -> list[Sample]:
        return self.rollouts.read(rollout_id).samples

    def sample_rows(self, rollout_id: int, n: int) -> list[dict]:
        """n samples of a rollout, spread across its prompts, as table rows (miles_core/tracking/samples.py);
        log_multi_turn adds the conversations."""
        conversation = (lambda s: conversation_columns(s, self.tokenizer)) if self.cfg.tracking.log_multi_turn else (lambda s: {})
        return sample_rows(self.load_rollout(rollout_id), n, lambda r: reward_value(r, self.cfg.rollout.reward_key), conversation)

    # ---- 3. train ----------------------------------------------------------------------------------
    def train(self, rollout_id: int) -> TrainOutput:
        """debug_rollout_only: no train step (nothing returned)."""
        if self.cfg.misc.debug_rollout_only:
            return TrainOutput(rollout={}, steps=[])
        self.events.before_train(rollout_id)  # enable_event_analyzer: the syncs so far held what was sent
        samples = self.load_rollout(rollout_id)
        rewards = [reward_value(s.reward, self.cfg.rollout.reward_key) for s in samples]
        self.fleet.before_train()
        wake = self.onload_trainer()
        out = self.trainer.train_rollout(samples, rewards, rollout_id)
        if self.cfg.misc.ci_test:  # the reference's CI checks of the step (runtime/ci_checks.py)
            ci_checks.check_train(self.cfg.misc, rollout_id, out.rollout, out.steps, self.cfg.num_steps_per_rollout,
                                  lora=self.cfg.lora.lora_rank > 0)
        self.last_trained = rollout_id
        self.events.train(rollout_id, out)
        return TrainOutput(rollout=out.rollout | staleness_metrics(samples, self.weight_version) | wake, steps=out.steps)

    # ---- 4. save / restore -------------------------------------------------------------------------
    def save(self, rollout_id: int, state: dict) -> dict[str, float]:
        """debug_rollout_only: nothing trained, nothing saved (the reference's actors skip it)."""
        if self.cfg.misc.debug_rollout_only:
            return {}
        t0 = time.perf_counter()
        self.wait_saves()  # async_save: the previous checkpoint is complete before the next one starts
        self.onload_trainer()
        with self.paused():
            state = {**state, "data_source": self.source.state_dict(), "weight_version": self.weight_version, **self.async_state()}
            if self.cfg.misc.ci_test and self.cfg.misc.ci_save_model_hash:
                state["model_hash"] = ci_checks.model_hashes(self.trainer.named_tensors())
            self.trainer.save(self.cfg.save_dir, rollout_id, state)
            if self._user_source() is not None:  # data_source_path: the user's class saves its own state, as the reference's
                self._user_source().save(rollout_id)
        self._unpruned = rollout_id
        if not self.cfg.checkpoint.async_save:  # the checkpoint is complete: prune now
            self.wait_saves()
        self.events.saved(rollout_id)  # save_debug_event_data: the event dir as of this checkpoint, beside it
        return {"perf/save_model_time": time.perf_counter() - t0}

    def wait_saves(self) -> None:
        """async_save: block until the checkpoint being written in the background is complete (its error raised), then
        drop the rollout files a resume from it no longer reads. Before each save, at the run's end and at close
        (without async_save nothing is pending: the trainer is not asked)."""
        if self.cfg.checkpoint.async_save:
            self.trainer.wait_saves()
        if self._unpruned is not None:
            self.rollouts.prune(self._unpruned)
            self._unpruned = None

    def restore(self) -> dict | None:
        """Load the latest complete checkpoint of load_dir into the trainer and the engines; -> its meta, or None."""
        self.onload_trainer()
        meta = self.trainer.restore(self.cfg.load_dir)
        start = self.cfg.data.start_rollout_id
        if meta is None:
            if start is not None:
                raise ValueError(f"start_rollout_id ({start}) resumes from a checkpoint, and {self.cfg.load_dir} has none (the "
                                 "reference resets it to 0 then): drop start_rollout_id, or set load to a checkpoint dir")
            return None
        if self.cfg.misc.ci_test and self.cfg.misc.ci_check_model_hash:
            ci_checks.compare_model_hashes(meta.get("model_hash"), ci_checks.model_hashes(self.trainer.named_tensors()),
                                           f"{self.cfg.load_dir} (rollout {meta['rollout_id']})")
        data_of = meta["rollout_id"] if start is None else start - 1  # start_rollout_id: the data state of the rollout before it
        if data_of >= 0:
            self.source.load_state_dict(meta["data_source"] if data_of == meta["rollout_id"] else self._data_state(data_of))
        if self._user_source() is not None and data_of >= 0:
            self._user_source().load(data_of)
        self.weight_version = meta["weight_version"]
        self.last_trained = data_of
        self.events.restored(meta)  # the checkpoint's event dir back (save_debug_event_data)
        self.restore_async(meta)
        self.sync_weights()  # the sync that followed this save in the interrupted run (version + 1)
        return meta

    def _data_state(self, rollout_id: int) -> dict:
        """start_rollout_id: the data-source state the checkpoint of ``rollout_id`` saved (load_dir), as the reference's
        RolloutManager.load(start_rollout_id - 1)."""
        from miles_core.checkpoint.load import list_checkpoints

        found = {info.rollout_id: info for info in list_checkpoints(self.cfg.load_dir)}
        if rollout_id not in found:
            raise ValueError(f"start_rollout_id ({rollout_id + 1}) takes the data state of rollout {rollout_id} from its "
                             f"checkpoint, and {self.cfg.load_dir} has none (checkpoints of rollouts {sorted(found)}): choose "
                             "one after a checkpointed rollout, or drop start_rollout_id")
        return found[rollout_id].meta["data_source"]

    def _user_source(self):
        """The data_source_path class's object (None when the data source is ours), once a rollout function is used."""
        if self.cfg.rollout.rollout_function_path is None:
            return None
        src = self.reference_source()
        return None if isinstance(src, RolloutDataSourceWithBuffer) else src

    # ---- 5. weight sync ----------------------------------------------------------------------------
    def sync_weights(self) -> dict[str, float]:
        """The trainer's weights -> every engine (version + 1); background generation is paused meanwhile.
        A failed sync leaves the version where it was (the engines resume generating on the weights they have).
        debug_skip_weight_update, debug_rollout_only (nothing trained), debug_train_only (no engines): nothing is sent, the
        version stays."""
        m = self.cfg.misc
        if m.debug_skip_weight_update or m.debug_rollout_only or m.train_only:
            return self.offload_trainer()  # debug_skip_weight_update keeps the offload schedule (the reference's)
        check = m.check_weights and self.weight_version == 0  # a fresh run's first sync: the engines hold hf_checkpoint
        self.onload_trainer()
        with self.paused():
            if check:  # the reference's check_weight_update_equal: snapshot, scramble, sync, compare
                self._check_weights("snapshot")
                self._check_weights("reset_tensors")
            metrics = self.fleet.update_weights(self.weights, self.weight_version + 1)
            self.weight_version += 1
            if check:
                self._check_weights("compare")
            self.events.sync(self.last_trained, self.weight_version, self.weights, self.engine)
        metrics = {**metrics, **self.offload_trainer()}  # the engines generate next
        if self.cfg.misc.ci_test:  # the reference's FSDP actor: the engines serve the version just sent
            served = self.engine.get_weight_version()
            if served != self.weight_version:
                raise ci_checks.CICheckFailed(f"ci_test: after the weight sync the engines report weight version {served}, the "
                                              f"trainer sent {self.weight_version}")
        return metrics

    def _check_weights(self, action: str) -> None:
        m = self.cfg.misc
        self.engine.check_weights(action, m.check_weight_update_skip_list, m.check_weight_update_allow_quant_error,
                                  m.check_weight_update_selector)

    # ---- 6. eval -----------------------------------------------------------------------------------
    def evaluate(self) -> PointResult:
        """Inline eval of the live engines, pinned to the current weight version (a point that cannot run
        gives eval/skipped_<reason>)."""
        with self.paused():
            return run_on_engine(self.engine, self.data.eval_suite, self.weight_version, self.last_trained)

    def snapshot_evals(self) -> SnapshotEvaluator:
        """eval_mode snapshot: background evals of HF snapshots in <eval_hf_dir or run_dir/eval_snapshots>/<weight version>/."""
        if self._snapshot_evals is None:
            e = self.cfg.eval
            export = lambda root, version: self.export_to(root, version)  # noqa: E731
            load = lambda path, version: load_hf_engine(path, version, self.cfg.misc.dtype, self.cfg.cluster.device)  # noqa: E731
            root = Path(e.eval_hf_dir) if e.eval_hf_dir is not None else self.cfg.run_dir / "eval_snapshots"
            self._snapshot_evals = SnapshotEvaluator(self.data.eval_suite, root, export, load,
                                                     e.eval_max_in_flight, e.eval_overflow_policy, e.eval_keep_snapshots,
                                                     version_now=lambda: self.weight_version)
        return self._snapshot_evals

    # ---- 7. export ---------------------------------------------------------------------------------
    def export(self, rollout_id: int) -> Path:
        return self.export_to(self.cfg.export_dir, rollout_id)

    def export_to(self, root: Path, rollout_id: int) -> Path:
        self.onload_trainer()
        return self.trainer.export(root, rollout_id, self.tokenizer)

    # ---- offload_train -------------------------------------------------------------------------------
    def offload_trainer(self) -> dict[str, float]:
        """offload_train: the trainer's state to host memory (the engines generate next); -> perf/sleep_time (the
        reference's name), {} when it was already there or offload_train is off."""
        if not self._offloads_trainer or self._trainer_offloaded:
            return {}
        t0 = time.perf_counter()
        self.trainer.offload()
        self._trainer_offloaded = True
        return {"perf/sleep_time": time.perf_counter() - t0}

    def onload_trainer(self) -> dict[str, float]:
        """The trainer's state back on its device before a stage reads it (train, save, export, weight sync, restore);
        -> perf/wake_up_time, {} when it was there."""
        if not self._trainer_offloaded:
            return {}
        t0 = time.perf_counter()
        self.trainer.onload()
        self._trainer_offloaded = False
        return {"perf/wake_up_time": time.perf_counter() - t0}

    # ---- async ---------------------------------------------------------------------------------------
    def fully_async_worker(self) -> FullyAsyncWorker:
        """async_mode fully: the background generator (created here, started at the first take)."""
        if self._async_worker is None:
            r = self.cfg.rollout
            self._async_worker = FullyAsyncWorker(
                self.engine, self.source, self.rollout_spec(), self.data.rewards, self.decode, lambda: self.weight_version,
                capacity=r.fully_async_buffer_groups or int(r.async_data_buffer_capacity_factor * r.rollout_batch_size),
                max_staleness=r.max_weight_staleness,
                policy=r.stale_group_policy or {"retry": "recycle", "drop": "drop"}[r.async_unused_samples_handler],
                round_groups=None if r.async_max_concurrent_samples is None else max(1, r.async_max_concurrent_samples // r.n_samples_per_prompt))
        return self._async_worker

    def paused(self) -> contextlib.AbstractContextManager:
        """No background generation inside (weight sync, save, inline eval); a no-op unless async_mode is fully."""
        return self._async_worker.paused() if self._async_worker is not None else contextlib.nullcontext()

    def async_state(self) -> dict:
        """The async part of a checkpoint: the fully-async buffer (call inside paused())."""
        return {"async_buffer": self._async_worker.state_dict()} if self._async_worker is not None else {}

    def restore_async(self, meta: dict) -> None:
        mode = self.cfg.rollout.async_mode
        if mode == "one_step":  # rollout i+1 was generated (before training on i) and written before checkpoint i
            self._accept_rollout = meta["rollout_id"] + 1
        elif mode == "fully" and "async_buffer" in meta:
            self.fully_async_worker().load_state_dict(meta["async_buffer"])

    def finish_checks(self) -> None:
        """The run's end: ci_metric_checker_key must have reached its threshold at some eval point (the reference's
        MetricChecker.dispose)."""
        if self.metric_checker is not None:
            self.metric_checker.dispose()
        self.events.check("at the run's end")

    def close(self) -> None:
        """Wait for a checkpoint still being written (async_save), then stop background generation, the fleet and what
        the placement holds (in that order, also when the wait raises)."""
        try:
            self.wait_saves()
        finally:
            self._close_parts()

    def _close_parts(self) -> None:
        if self._async_worker is not None:
            self._async_worker.stop()
        if self._snapshot_evals is not None:
            self._snapshot_evals.close()
        self.fleet.close()
        for close in self._closers:
            close()

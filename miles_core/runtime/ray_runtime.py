"""The Ray runtime: the same stages as LocalRuntime, with the trainer as a data-parallel group of
Ray actors and the rollout engines as HTTP servers (one per engine actor) behind a router.

The driver (this object, in the flow's process) keeps what LocalRuntime keeps apart from models:
tokenizer, data source, rewards, sampling parameters, rollout files. generate / load_rollout /
sample_rows / evaluate are LocalRuntime's own functions, run with ``engine`` = the EngineRouter.
train sends the rollout to every rank; weights, checkpoints and exports come from rank 0 (the
ranks hold equal weights). See docs/ray.md.

Weight sync: ``WeightSync`` in mode ``update_weight_mode`` (tensor / broadcast / disk). Colocated,
the engines release their memory for the train stage and resume it (weights first) at the sync.
Fault tolerance (``use_fault_tolerance``): a HealthMonitor thread restarts engines that fail their
health check; a restarted engine gets the current weights before it rejoins the router (or, while
the trainer is ahead of the engines, waits out of generate for the next sync). ``_weights_lock``
orders monitor rounds, the train stage's start and syncs; ``_fresh``: the trainer's weights are
those the engines serve.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from miles_core.config import TrainConfig
from miles_core.data import DataSource, load_prompts
from miles_core.env import cache_dir
from miles_core.evaluation import build_suite
from miles_core.models import resolve_model_path
from miles_core.rewards import reward_value
from miles_core.rollout.metrics import staleness_metrics
from miles_core.weights.sync import WeightSync

from .local import LocalRuntime, prompt_spec, resolve_data_path, reward_options, sampling_params
from .ray.engines import EngineGroup
from .ray.health import HealthMonitor
from .ray.placement import create_placement_group, plan_placement
from .ray.session import start_ray
from .ray.train_group import RankZeroSender, TrainGroup

ALL_MEMORY = ["weights", "kv_cache", "cuda_graph"]
log = logging.getLogger(__name__)


class RayRuntime:
    # the driver-side stages are LocalRuntime's, on this object's engine (the router), source and files
    num_rollout = LocalRuntime.num_rollout
    decode = LocalRuntime.decode
    rollout_path = LocalRuntime.rollout_path
    generate = LocalRuntime.generate
    load_rollout = LocalRuntime.load_rollout
    sample_rows = LocalRuntime.sample_rows
    evaluate = LocalRuntime.evaluate
    # async_mode (docs/advanced/async.md): the fully-async worker generates through the router
    rollout_spec = LocalRuntime.rollout_spec
    fully_async_worker = LocalRuntime.fully_async_worker
    paused = LocalRuntime.paused
    async_state = LocalRuntime.async_state
    restore_async = LocalRuntime.restore_async

    def __init__(self, cfg: TrainConfig):
        import ray
        from transformers import AutoTokenizer

        self.cfg = cfg
        cl = cfg.cluster
        self.model_path = resolve_model_path(cfg.checkpoint.hf_checkpoint, cache_dir())
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        prompts, self.dropped_prompts = load_prompts(resolve_data_path(cfg.data.prompt_data), self.tokenizer, prompt_spec(cfg))
        self.num_prompts = len(prompts)
        self.source = DataSource(prompts, shuffle=cfg.data.rollout_shuffle, seed=cfg.data.rollout_seed)
        self.eval_suite = build_suite(cfg, self.tokenizer)
        self.params = sampling_params(cfg, self.tokenizer.eos_token_id)
        self.rewards = reward_options(cfg)
        self.weight_version = 0
        self._async_worker = None
        self._taken: dict[int, tuple[list, dict]] = {}
        self._accept_rollout: int | None = None
        self._started_ray = start_ray(cl.ray_address, len(plan_placement(cl, use_gpu=False).bundles))
        self.plan = plan_placement(cl, use_gpu=ray.cluster_resources().get("GPU", 0) > 0)
        if self.plan.num_train > cfg.global_batch_size:
            raise ValueError(f"{self.plan.num_train} train ranks but global_batch_size {cfg.global_batch_size}: every rank needs rows")
        self.pg = create_placement_group(self.plan)
        res = self.plan.actor_resources()
        self.train_group = TrainGroup(cfg, str(self.model_path), self.pg, self.plan.train_bundles, res)
        self.engines = EngineGroup(cfg, self.model_path, self.pg, self.plan.engine_bundles, res)
        self.sender = RankZeroSender(self.train_group.workers[0])
        self.weight_sync = WeightSync(cl.weight_sync_mode, cl.update_weight_buffer_size, cfg.run_dir / "weight_sync",
                                      backend="nccl" if self.plan.bundles[0].get("GPU") else "gloo")
        self._weights_lock = threading.Lock()
        self._fresh = True  # trainer weights == what the engines serve (true at start: both load hf_checkpoint)
        self._released = False
        self.monitor = None
        if cl.use_fault_tolerance and "rollout" in cl.ft_components:
            self.monitor = HealthMonitor(lambda: list(self.engines.urls), self._recover_engine, cl.rollout_health_check_interval,
                                         cl.rollout_health_check_timeout, self._weights_lock, busy=lambda: self._released).start()

    @property
    def engine(self):
        """The RolloutEngine the stages use: the router over the engine servers."""
        return self.engines.router

    # ---- stages ------------------------------------------------------------------------------------
    def train(self, rollout_id: int) -> tuple[dict[str, float], list[dict[str, float]]]:
        samples = self.load_rollout(rollout_id)
        rewards = [reward_value(s.reward, self.cfg.rollout.reward_key) for s in samples]
        with self._weights_lock:
            self._fresh = False  # from here the trainer is ahead of the engines
            if self.cfg.cluster.colocate and not self._released:
                self.engine.release_memory_occupation(ALL_MEMORY)
                self._released = True
        rollout, steps = self.train_group.call("train_rollout", samples, rewards, rollout_id)
        return rollout | staleness_metrics(samples, self.weight_version), steps

    def sync_weights(self) -> dict[str, float]:
        """Restart dead engines, resume released memory (weights first), then rank 0's weights -> every
        engine (version + 1) in the configured mode; the fully-async worker is paused meanwhile."""
        with self.paused(), self._weights_lock:
            self.engines.restart_dead()
            if self._released:
                self.engine.resume_memory_occupation(["weights"])
            self.weight_version += 1
            metrics = self.weight_sync.sync(self.sender, self.engine, self.weight_version)
            if self._released:
                self.engine.resume_memory_occupation([t for t in ALL_MEMORY if t != "weights"])
                self._released = False
            self._fresh = True
        return {**metrics, "rollout/engine_restarts": float(self.engines.restarts)}

    def _recover_engine(self, i: int) -> None:
        """Health monitor (holds _weights_lock): restart engine i; load the served weights into it when the
        trainer still has them, else leave it out of generate (version -1) until the next sync."""
        from miles_core.rollout.http import EngineRouter

        url = self.engines.restart(i)
        version = -1
        if self._fresh:
            try:
                with EngineRouter([self.engines.client(url)], bucket_bytes=self.cfg.cluster.update_weight_buffer_size) as one:
                    self.weight_sync.sync(self.sender, one, self.weight_version)
                version = self.weight_version
            except Exception:  # noqa: BLE001 - the engine still joins, out of generate until the next sync reaches it
                log.exception("engine %d restarted but loading weights version %d into it failed", i, self.weight_version)
        self.engine.replace_engine(i, self.engines.client(url), version)

    def snapshot_evals(self):
        raise NotImplementedError("eval_mode snapshot is not implemented for the ray runtime yet; use inline eval")

    # ---- checkpoints ---------------------------------------------------------------------------------
    def save(self, rollout_id: int, state: dict) -> dict[str, float]:
        t0 = time.perf_counter()
        with self.paused():
            self.train_group.rank0("save", rollout_id, {**state, "data_source": self.source.state_dict(),
                                                        "weight_version": self.weight_version, **self.async_state()})
        return {"perf/save_model_time": time.perf_counter() - t0}

    def restore(self) -> dict | None:
        """Every rank loads the latest complete checkpoint of load_dir; the driver its data cursor."""
        meta = self.train_group.call("restore")
        if meta is None:
            return None
        self.source.load_state_dict(meta["data_source"])
        self.weight_version = meta["weight_version"]
        self.restore_async(meta)
        self.sync_weights()  # the sync that followed this save in the interrupted run (version + 1)
        return meta

    def export(self, rollout_id: int) -> Path:
        return Path(self.train_group.rank0("export", rollout_id))

    def close(self) -> None:
        import ray

        if self._async_worker is not None:
            self._async_worker.stop()
        if self.monitor is not None:
            self.monitor.stop()
        self.weight_sync.close()
        self.engines.shutdown()
        self.train_group.shutdown()
        ray.util.remove_placement_group(self.pg)
        if self._started_ray:
            ray.shutdown()


__all__ = ["RayRuntime"]

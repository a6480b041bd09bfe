"""The Ray runtime: the same stages as LocalRuntime, with the trainer as a data-parallel group of
Ray actors and the rollout engines as HTTP servers (one per engine actor) behind a router.

The driver (this object, in the flow's process) keeps what LocalRuntime keeps apart from models:
tokenizer, data source, rewards, sampling parameters, rollout files. generate / load_rollout /
sample_rows / evaluate are LocalRuntime's own functions, run with ``engine`` = the EngineRouter.
train sends the rollout to every rank; weights, checkpoints and exports come from rank 0 (the
ranks hold equal weights). See docs/ray.md.
"""

from __future__ import annotations

import time
from pathlib import Path

from miles_core.config import TrainConfig
from miles_core.data import DataSource, load_prompts
from miles_core.env import cache_dir
from miles_core.evaluation import build_suite
from miles_core.models import resolve_model_path
from miles_core.rewards import reward_value
from miles_core.tracking import catalog
from miles_core.tracking.catalog import ROLLOUT, Metric
from miles_core.weights.sync import sync_weights

from .local import LocalRuntime, prompt_spec, resolve_data_path, reward_options, sampling_params
from .ray.engines import EngineGroup
from .ray.placement import create_placement_group, plan_placement
from .ray.session import start_ray
from .ray.train_group import TrainGroup

catalog.register(Metric("rollout/engine_restarts", ROLLOUT, "engine servers restarted so far (dead before a weight sync)",
                        "runtime ray", "miles_core/runtime/ray_runtime.py"))


class RayRuntime:
    # the driver-side stages are LocalRuntime's, on this object's engine (the router), source and files
    num_rollout = LocalRuntime.num_rollout
    decode = LocalRuntime.decode
    rollout_path = LocalRuntime.rollout_path
    generate = LocalRuntime.generate
    load_rollout = LocalRuntime.load_rollout
    sample_rows = LocalRuntime.sample_rows
    evaluate = LocalRuntime.evaluate

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
        self._started_ray = start_ray(cl.ray_address, len(plan_placement(cl, use_gpu=False).bundles))
        self.plan = plan_placement(cl, use_gpu=ray.cluster_resources().get("GPU", 0) > 0)
        if self.plan.num_train > cfg.global_batch_size:
            raise ValueError(f"{self.plan.num_train} train ranks but global_batch_size {cfg.global_batch_size}: every rank needs rows")
        self.pg = create_placement_group(self.plan)
        res = self.plan.actor_resources()
        self.train_group = TrainGroup(cfg, str(self.model_path), self.pg, self.plan.train_bundles, res)
        self.engines = EngineGroup(cfg, self.model_path, self.pg, self.plan.engine_bundles, res)

    @property
    def engine(self):
        """The RolloutEngine the stages use: the router over the engine servers."""
        return self.engines.router

    # ---- stages ------------------------------------------------------------------------------------
    def train(self, rollout_id: int) -> tuple[dict[str, float], list[dict[str, float]]]:
        samples = self.load_rollout(rollout_id)
        rewards = [reward_value(s.reward, self.cfg.rollout.reward_key) for s in samples]
        return self.train_group.call("train_rollout", samples, rewards, rollout_id)

    def sync_weights(self) -> dict[str, float]:
        """Restart dead engines, then rank 0's weights -> every engine in buckets (version + 1)."""
        self.engines.restart_dead()
        self.weight_version += 1
        t0 = time.perf_counter()
        named = self.train_group.rank0("named_tensors")
        fetch = time.perf_counter() - t0
        metrics = sync_weights(named, [self.engine], self.weight_version, self.cfg.cluster.update_weight_buffer_size)
        metrics["perf/update_weights_time"] += fetch
        return {**metrics, "rollout/engine_restarts": float(self.engines.restarts)}

    def snapshot_evals(self):
        raise NotImplementedError("eval_mode snapshot is not implemented for the ray runtime yet; use inline eval")

    # ---- checkpoints ---------------------------------------------------------------------------------
    def save(self, rollout_id: int, state: dict) -> dict[str, float]:
        t0 = time.perf_counter()
        self.train_group.rank0("save", rollout_id, {**state, "data_source": self.source.state_dict(), "weight_version": self.weight_version})
        return {"perf/save_model_time": time.perf_counter() - t0}

    def restore(self) -> dict | None:
        """Every rank loads the latest complete checkpoint of load_dir; the driver its data cursor."""
        meta = self.train_group.call("restore")
        if meta is None:
            return None
        self.source.load_state_dict(meta["data_source"])
        self.weight_version = meta["weight_version"]
        self.sync_weights()  # the sync that followed this save in the interrupted run (version + 1)
        return meta

    def export(self, rollout_id: int) -> Path:
        return Path(self.train_group.rank0("export", rollout_id))

    def close(self) -> None:
        import ray

        self.engines.shutdown()
        self.train_group.shutdown()
        ray.util.remove_placement_group(self.pg)
        if self._started_ray:
            ray.shutdown()


__all__ = ["RayRuntime"]

"""The Ray placement: a placement group of train and engine bundles, a TrainGroup (the trainer ranks) and
M engine actors, each holding an HTTP engine server, behind a router (an HTTPFleet). GPUs are reserved
when the config's device asks for them (cuda, or auto on a cluster with GPUs); gloo on CPU, NCCL on GPU
(the train group's process group and the broadcast weight sync). An actor placed with GPUs sees only its
own (Ray sets CUDA_VISIBLE_DEVICES); an engine server sees the GPUs of all its bundles
(rollout_num_gpus_per_engine of them: placement.py engine_devices) and resolves ``device`` in its own
process (miles_core/device.py).
With rollout_external_engine_addrs only the train ranks are placed: the fleet is a router over the engines
already running (probed before any rank starts), and rank 0 sends them the weights (tensor, broadcast, disk)."""

from __future__ import annotations

from miles_core.config import TrainConfig

from ..runtime import RunData, RunParts
from .engines import ENGINE_SERVERS, EngineGroup
from .placement import create_placement_group, plan_placement
from .session import start_ray
from .train_group import RankZeroSender, TrainGroup


def wants_gpu(cfg: TrainConfig) -> bool:
    """Whether the bundles reserve GPUs. device: cuda on a cluster without any fails here, naming the field, before
    anything is placed; a part that cannot run on a GPU yet is refused by name (preflight.check_gpu_supported)."""
    import ray

    from miles_core.preflight import PreflightError, check_gpu_supported

    device, gpus = cfg.cluster.device, ray.cluster_resources().get("GPU", 0)
    if device == "cuda" and not gpus:
        raise PreflightError(f"device: cuda, but the Ray cluster ({cfg.cluster.ray_address or 'local'}) has no GPU; "
                             "use device: cpu (or auto)")
    use = device == "cuda" or (device == "auto" and gpus > 0)
    if use:
        check_gpu_supported(cfg)
    return use


def build_ray(cfg: TrainConfig, data: RunData) -> RunParts:
    import ray

    cl = cfg.cluster
    launched = not cfg.rollout.external_engines
    started = start_ray(cl.ray_address, len(plan_placement(cl, use_gpu=False, engines=launched).bundles))
    plan = plan_placement(cl, use_gpu=wants_gpu(cfg), engines=launched)
    if plan.num_train > cfg.global_batch_size:
        raise ValueError(f"{plan.num_train} train ranks but global_batch_size {cfg.global_batch_size}: every rank needs rows")
    pg = create_placement_group(plan)
    closers = [lambda: ray.util.remove_placement_group(pg)] + ([ray.shutdown] if started else [])
    built: list = []  # the shutdown of each part built so far
    try:
        train_group, fleet = _build_parts(cfg, data, plan, pg, built)
    except BaseException:
        for close in [*reversed(built), *closers]:  # nothing stays placed after a failed build: a retried prepare starts clean
            close()
        raise
    return RunParts(trainer=train_group, fleet=fleet, weights=RankZeroSender(train_group), close=[train_group.shutdown, *closers])


def _build_parts(cfg: TrainConfig, data: RunData, plan, pg, built: list):
    """-> (the train group, the engine fleet) in the placement group; appends each part's shutdown to ``built``."""
    from miles_core.rollout.http import EngineRouter, HTTPFleet
    from miles_core.rollout.http.options import router_options, weight_sync

    cl = cfg.cluster
    backend = "nccl" if plan.bundles[0].get("GPU") else "gloo"
    res = plan.actor_resources()
    if cfg.rollout.external_engines:
        from miles_core.rollout.http.external import external_fleet

        fleet = external_fleet(cfg, backend)  # probed first: a bad address fails before any rank loads the model
        built.append(fleet.close)
        train_group = TrainGroup(cfg, str(data.model_path), pg, plan.train_bundles, res, backend)
        built.append(train_group.shutdown)
        return train_group, fleet
    train_group = TrainGroup(cfg, str(data.model_path), pg, plan.train_bundles, res, backend)
    built.append(train_group.shutdown)
    engines = EngineGroup(cfg, data.model_path, pg, plan, ENGINE_SERVERS[cl.rollout_engine])
    built.append(engines.shutdown)
    router = EngineRouter([engines.client(u) for u in engines.urls], **router_options(cfg, len(engines.urls)))
    fleet = HTTPFleet(router, weight_sync(cfg, backend), offload_tags=cl.rollout_offload_tags, launcher=engines,
                      client=engines.client)  # its close() shuts the engines down
    if cl.use_fault_tolerance and "rollout" in cl.ft_components:
        fleet.watch(cl.rollout_health_check_interval, cl.rollout_health_check_timeout, cl.rollout_health_check_first_wait)
    return train_group, fleet

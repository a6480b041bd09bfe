"""Engines already running (``rollout_external_engine_addrs``): an HTTPFleet over them, nothing launched.

Any server speaking the SGLang HTTP protocol: SGLang's, or ours (``python -m miles_core.rollout.http.server``).
The API key is the one the servers were started with, read from ``MILES_ENGINE_API_KEY`` in this process's
environment (unset: no key is sent); it never enters the config, so it is not logged as a run param.

    fleet = external_fleet(cfg)     # every engine answers /health_generate and an authorized call, or this raises

Either runtime: locally the trainer is in this process; on Ray only the train ranks are placed and rank 0
sends the weights. Weight sync (``update_weight_mode``): tensor (buckets POSTed as safetensors: our
servers), broadcast (the engines join a process group hosted by the sender, at its host's address, and
receive each bucket by broadcast: gloo on CPU, NCCL on GPU; the engines must reach that address) or disk
(an HF dir under <run_dir>/weight_sync that the engines load: they must see this filesystem; SGLang's
servers). A dead engine (use_fault_tolerance) is marked dead, never restarted: the fleet has no launcher.
"""

from __future__ import annotations

from miles_core.config import TrainConfig
from miles_core.config.rollout import API_KEY_ENV, engine_api_key, engine_url

from .fleet import HTTPFleet
from .options import client_options, router_options, weight_sync
from .router import EngineRouter


class ExternalEngineError(RuntimeError):
    """An engine of rollout_external_engine_addrs cannot be used; the message names its address."""


def external_router(cfg: TrainConfig) -> EngineRouter:
    """A router over the configured addresses, every engine probed: raises ExternalEngineError naming each bad one."""
    urls = [engine_url(a) for a in cfg.rollout.rollout_external_engine_addrs]
    router = EngineRouter.from_urls(urls, client_options(cfg, engine_api_key()), **router_options(cfg, len(urls)))
    router.check_health()
    bad = [row for row in router.status() if not row["healthy"]]
    if bad:
        router.close()
        rows = "; ".join(f"{row['url']}: {row['last_error']}" for row in bad)
        raise ExternalEngineError(f"rollout_external_engine_addrs: {len(bad)} of {len(urls)} engine(s) not usable: {rows} "
                                  f"(start them first; a 401 means {API_KEY_ENV} is not the key they were started with)")
    return router


def external_fleet(cfg: TrainConfig, backend: str = "gloo") -> HTTPFleet:
    """backend: the broadcast group's (gloo on CPU, nccl when the sender's weights are on GPUs)."""
    cl = cfg.cluster
    fleet = HTTPFleet(external_router(cfg), weight_sync(cfg, backend), offload_tags=cfg.cluster.rollout_offload_tags)
    if cl.use_fault_tolerance and "rollout" in cl.ft_components:
        fleet.watch(cl.rollout_health_check_interval, cl.rollout_health_check_timeout, cl.rollout_health_check_first_wait)
    return fleet

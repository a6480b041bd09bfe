"""How a run's config shapes its engine clients, router and weight sync (one place for the launched and the
external fleets).

    client_options(cfg, api_key)     HTTPEngineClient keywords: fail fast (the router fails over), the API key,
                                     the read timeout (miles_router_timeout, else sglang_router_request_timeout_secs)
    router_options(cfg, n_engines)   EngineRouter keywords: failure threshold, requests in flight at most
    weight_sync(cfg, backend)        the run's WeightSync (mode, buckets, directory, pause mode, LoRA adapter and its check,
                                     disk-delta options)
    delta_options(cfg)               disk-delta's DeltaOptions (None in another mode), its post-write hook resolved
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from miles_core.config import TrainConfig
    from miles_core.weights.sync import DeltaOptions, WeightSync


def client_options(cfg: "TrainConfig", api_key: str | None) -> dict[str, Any]:
    sg = cfg.sglang
    timeout = sg.miles_router_timeout if sg.miles_router_timeout is not None else float(sg.sglang_router_request_timeout_secs)
    return {"max_retries": 1, "backoff_s": 0.05, "bucket_bytes": cfg.cluster.update_weight_buffer_size,
            "api_key": api_key, "timeout_s": timeout}


def router_options(cfg: "TrainConfig", n_engines: int) -> dict[str, Any]:
    """The reference bounds requests in flight twice: its rollout semaphore (sglang_server_concurrency per engine) and
    its MilesRouter's connection pool (miles_router_max_connections, by default the same product): the lower applies."""
    sg = cfg.sglang
    bound = sg.sglang_server_concurrency * n_engines
    if sg.miles_router_max_connections is not None:
        bound = min(bound, sg.miles_router_max_connections)
    return {"max_failures": sg.miles_router_health_check_failure_threshold, "max_in_flight": bound,
            "bucket_bytes": cfg.cluster.update_weight_buffer_size, "policy": sg.sglang_router_policy or "least_loaded"}


def weight_sync(cfg: "TrainConfig", backend: str) -> "WeightSync":
    from miles_core.weights.sync import DeltaOptions, WeightSync

    cl = cfg.cluster
    return WeightSync(cl.weight_sync_mode, cl.update_weight_buffer_size, cfg.run_dir / "weight_sync", backend=backend,
                      pause_mode=cfg.rollout.pause_generation_mode, lora_adapter=cfg.lora.lora_sync_from_tensor,
                      check_adapter=cfg.misc.check_lora_weight_equal, delta=delta_options(cfg))


def delta_options(cfg: "TrainConfig") -> "DeltaOptions | None":
    """The update_weight_* disk-delta fields, and custom_update_weight_post_write_path resolved (with the reference's
    ``args`` it is called with); None unless the run's weight sync is disk-delta."""
    from miles_core.weights.sync import DeltaOptions

    cl = cfg.cluster
    if cl.weight_sync_mode != "disk-delta":
        return None
    hook = args = None
    if cl.custom_update_weight_post_write_path:
        from miles_core.resolve import reference_args, resolve
        from miles_core.rollout.multi_turn.spec import reference_args as flat_reference_args

        hook = resolve(cl.custom_update_weight_post_write_path, what="custom_update_weight_post_write_path")
        args = reference_args(**flat_reference_args(cfg))
    return DeltaOptions(disk_dir=cl.update_weight_disk_dir, local_dir=cl.update_weight_local_checkpoint_dir,
                        encoding=cl.update_weight_delta_encoding, checksum=cl.update_weight_delta_checksum,
                        hook=hook, hook_args=args)

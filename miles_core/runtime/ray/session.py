"""Attach to Ray: a cluster (``ray_address``) or a local Ray started here.

Workers get the driver's PREFECT_API_URL (so nothing in a worker starts its own temporary Prefect
server; workers never import prefect anyway), MILES_CACHE_DIR (builtin models and data) and
torch's thread count. A local Ray is started with as many logical CPUs as the plan has bundles
(at least the machine's): bundles are reservations, not pinned cores.
"""

from __future__ import annotations

import os

PROPAGATED = ("PREFECT_API_URL", "MILES_CACHE_DIR", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS")


def worker_env() -> dict[str, str]:
    return {k: os.environ[k] for k in PROPAGATED if k in os.environ}


def start_ray(address: str | None, num_bundles: int) -> bool:
    """Init Ray unless it already is. -> True if this call started it (the caller then shuts it down)."""
    import ray

    if ray.is_initialized():
        return False
    kw = {"runtime_env": {"env_vars": worker_env()}, "include_dashboard": False, "log_to_driver": False}
    if address:
        ray.init(address=address, **kw)
    else:
        ray.init(num_cpus=max(num_bundles, os.cpu_count() or 1), **kw)
    return True

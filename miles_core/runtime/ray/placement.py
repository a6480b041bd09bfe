"""Placement: which bundle each train worker and each engine uses.

Train workers: ``actor_num_nodes * actor_num_gpus_per_node`` bundles, one worker each. Engines:
``rollout_num_gpus / rollout_num_gpus_per_engine`` of them; an engine takes
``rollout_num_gpus_per_engine`` consecutive bundles (its actor runs on the first; its server sees the
GPUs of all of them). Colocated: the engines' bundles are the train bundles, shared as the reference
places them (slime ``ray/rollout.py``: engine actors ask 0.2 GPU; train actors 0.4 here), which leaves
room for the probe below; disaggregated: the engines get bundles of their own after the train bundles
(the actor asks its first bundle whole). External engines (``rollout_external_engine_addrs``,
``engines=False``): train bundles only, nothing placed for rollout.

A bundle is ``{"GPU": 1, "CPU": 1}`` on a cluster with GPUs, ``{"CPU": 1}`` without.

GPUs of an engine (``bundle_gpu_ids``): a tiny task per bundle (0.01 GPU) reports the GPU Ray gives that
bundle, before the engine actors start (as the reference's InfoActor does); engine j's server gets
``CUDA_VISIBLE_DEVICES`` = the GPUs of its ``rollout_num_gpus_per_engine`` bundles, so ``--tp-size N``
finds N devices (SGLang's base GPU id stays 0).

Engine addresses (``engine_hosts``): on one node every engine server binds 127.0.0.1 (nothing else can
reach it); when the placement group spans several nodes, each binds its node's address, so the router
(on the driver's node) reaches engines on the others; the per-run API key keeps everyone else out.
"""

from __future__ import annotations

from dataclasses import dataclass

from miles_core.config.cluster import ClusterConfig


COLOCATED_TRAIN_SHARE, COLOCATED_ENGINE_SHARE = 0.4, 0.2  # of a shared bundle (the reference's engine share)
PROBE_GPU = 0.01  # what a bundle_gpu_ids probe asks: fits beside both shares


@dataclass(frozen=True)
class Placement:
    bundles: list[dict[str, float]]
    train_bundles: list[int]  # bundle index of train rank r
    engine_bundles: list[int]  # bundle index of engine j (its first bundle)
    share: float  # fraction of its bundle a train actor asks for (0.4 colocated, 1 disaggregated)
    engine_share: float = 1.0  # fraction of its first bundle an engine actor asks for (0.2 colocated, 1 disaggregated)
    gpus_per_engine: int = 1  # bundles (GPUs) of each engine: rollout_num_gpus_per_engine

    @property
    def num_train(self) -> int:
        return len(self.train_bundles)

    @property
    def num_engines(self) -> int:
        return len(self.engine_bundles)

    def actor_resources(self) -> dict[str, float]:
        """What one train actor asks of its bundle: {"num_cpus": .., "num_gpus": ..}."""
        return self._resources(self.share)

    def engine_resources(self) -> dict[str, float]:
        """What one engine actor asks of its first bundle."""
        return self._resources(self.engine_share)

    def _resources(self, share: float) -> dict[str, float]:
        b = self.bundles[0]
        return {"num_cpus": b.get("CPU", 0) * share, "num_gpus": b.get("GPU", 0) * share}

    def engine_bundle_sets(self) -> list[list[int]]:
        """The bundles of each engine (its first one holds the actor)."""
        return [list(range(b, b + self.gpus_per_engine)) for b in self.engine_bundles]


def plan_placement(cluster: ClusterConfig, use_gpu: bool, engines: bool = True) -> Placement:
    n_train = cluster.actor_num_nodes * cluster.actor_num_gpus_per_node
    bundle = {"CPU": 1.0, "GPU": 1.0} if use_gpu else {"CPU": 1.0}
    if not engines:
        return Placement(bundles=[dict(bundle) for _ in range(n_train)], train_bundles=list(range(n_train)), engine_bundles=[],
                         share=1.0)
    n_rollout = cluster.rollout_num_gpus or n_train
    per_engine = cluster.rollout_num_gpus_per_engine
    if n_rollout % per_engine:
        raise ValueError(f"rollout_num_gpus ({n_rollout}) must be a multiple of rollout_num_gpus_per_engine ({per_engine})")
    if cluster.colocate and n_rollout > n_train:
        raise ValueError(f"colocate shares the train bundles: rollout_num_gpus ({n_rollout}) must be <= actor total ({n_train})")
    first = 0 if cluster.colocate else n_train
    n_bundles = n_train if cluster.colocate else n_train + n_rollout
    return Placement(bundles=[dict(bundle) for _ in range(n_bundles)], train_bundles=list(range(n_train)),
                     engine_bundles=list(range(first, first + n_rollout, per_engine)),
                     share=COLOCATED_TRAIN_SHARE if cluster.colocate else 1.0,
                     engine_share=COLOCATED_ENGINE_SHARE if cluster.colocate else 1.0, gpus_per_engine=per_engine)


def create_placement_group(plan: Placement, timeout_s: float = 120.0):
    """Reserve the bundles (PACK: one node when they fit). Raises with the plan if Ray cannot place them."""
    import ray
    from ray.util.placement_group import placement_group

    pg = placement_group(plan.bundles, strategy="PACK")
    if not pg.wait(timeout_s):
        ray.util.remove_placement_group(pg)
        raise RuntimeError(f"Ray could not place {len(plan.bundles)} bundles {plan.bundles[0]} within {timeout_s}s "
                           f"(cluster resources: {ray.cluster_resources()})")
    return pg


def in_bundle(pg, index: int) -> dict:
    """.options(**in_bundle(pg, i)) schedules an actor on bundle i."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index)}


def bundle_gpu_ids(pg, bundles: list[int]) -> list[list[str]]:
    """The GPU ids Ray assigns to each of ``bundles`` (as CUDA_VISIBLE_DEVICES writes them), one tiny task per bundle."""
    import ray

    @ray.remote(num_cpus=0, num_gpus=PROBE_GPU)
    def gpu_ids() -> list[str]:
        return [str(i) for i in ray.get_gpu_ids()]

    return ray.get([gpu_ids.options(**in_bundle(pg, b)).remote() for b in bundles])


def engine_devices(plan: Placement, pg) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES of each engine's server: the GPUs of its bundles (None without GPUs)."""
    if not plan.bundles[0].get("GPU"):
        return [None] * plan.num_engines
    sets = plan.engine_bundle_sets()
    ids = bundle_gpu_ids(pg, [b for bundles in sets for b in bundles])
    per = plan.gpus_per_engine
    return [",".join(g for gpu in ids[j * per:(j + 1) * per] for g in gpu) for j in range(len(sets))]


LOOPBACK = "127.0.0.1"


def engine_hosts(bundle_nodes: list[str], node_addresses: dict[str, str], engine_bundles: list[int]) -> list[str]:
    """The address engine j's server binds: 127.0.0.1 when every bundle is on one node, else the address of the
    node holding its bundle. ``bundle_nodes[b]``: the node id of bundle b; ``node_addresses``: node id -> address."""
    if len(set(bundle_nodes)) <= 1:
        return [LOOPBACK] * len(engine_bundles)
    return [node_addresses[bundle_nodes[b]] for b in engine_bundles]


def placed_engine_hosts(pg, engine_bundles: list[int]) -> list[str]:
    """engine_hosts for a created placement group (Ray's record of where each bundle went)."""
    import ray
    from ray.util import placement_group_table

    where = placement_group_table(pg)["bundles_to_node_id"]
    addresses = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
    return engine_hosts([where[b] for b in sorted(where)], addresses, engine_bundles)

"""Engines of TP > 1 on Ray see as many GPUs as they have TP ranks (finding 5: each engine actor got one GPU, 0.5
colocated, while its server was started with --tp-size N). A local Ray with declared GPUs (no real ones) assigns GPU
ids to bundles and sets CUDA_VISIBLE_DEVICES per actor: that case (two colocated engines of TP 2 on 4 declared GPUs)
runs on the Ray cluster of tests/runtime/test_ray_nodes.py (one Ray start for both); here, the plan."""

from __future__ import annotations

from miles_core.config import build_config
from miles_core.runtime.ray.placement import plan_placement

BASE = {"prompt_data": "x.jsonl", "rollout_batch_size": 4, "n_samples_per_prompt": 2, "runtime": "ray"}


def test_disaggregated_engines_of_tp_2_take_two_bundles_each():
    cfg = build_config({**BASE, "actor_num_gpus_per_node": 1, "rollout_num_gpus": 4, "rollout_num_gpus_per_engine": 2})
    plan = plan_placement(cfg.cluster, use_gpu=True)
    assert plan.engine_bundle_sets() == [[1, 2], [3, 4]] and plan.engine_resources() == {"num_cpus": 1.0, "num_gpus": 1.0}

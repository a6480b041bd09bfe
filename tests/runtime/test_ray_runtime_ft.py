"""The Ray runtime's fault tolerance, weight sync modes and colocated offload, at the runtime level
(real local Ray, real engine server processes on 127.0.0.1, no flow)."""

from __future__ import annotations

import time

import pytest
import torch

from flows.recipes import load_config

pytestmark = pytest.mark.usefixtures("local_ray")


def _cfg(tmp_path, **over):
    base = {"run_dir": str(tmp_path / "run"), "runtime": "ray", "actor_num_gpus_per_node": 1, "rollout_batch_size": 4,
            "n_samples_per_prompt": 4, "rollout_max_response_len": 8, "eval_interval": None, "skip_eval_before_train": True,
            "num_threads": 1}
    return load_config("tiny", {**base, **over})


def _engine_weights_equal_trainer(rt, url: str) -> bool:
    from miles_core.rollout.http import HTTPEngineClient

    rt.onload_trainer()  # colocated: offload_train parked the trainer after the sync
    named = rt.trainer.named_tensors()
    with HTTPEngineClient(url, api_key=rt.fleet.launcher.api_key) as c:
        return all(torch.equal(c.get_weights_by_name(n), t) for n, t in named)


def test_engine_killed_mid_rollout_is_restarted(tmp_path, monkeypatch):
    """Engine 0 dies (os._exit, as SIGKILL: no cleanup) on its second /generate call of the rollout: the
    rollout completes with every (group_index, index) exactly once; the monitor restarts the engine,
    loads the served weights (broadcast mode: the disaggregated default) and puts it back in the
    router; the restart is counted in rollout/engine_restarts."""
    from miles_core.rollout.http import HTTPEngineClient
    from miles_core.rollout.http.server import FAULT_ENV
    from miles_core.runtime.placement import build_runtime

    monkeypatch.setenv(FAULT_ENV, "1")
    cfg = _cfg(tmp_path, rollout_num_gpus=2, use_fault_tolerance=True, rollout_health_check_interval=0.5,
               rollout_health_check_timeout=5.0)
    assert cfg.cluster.weight_sync_mode == "broadcast"
    rt = build_runtime(cfg)
    try:
        rt.sync_weights()
        dead_url = rt.fleet.launcher.urls[0]
        with HTTPEngineClient(dead_url, api_key=rt.fleet.launcher.api_key) as c:
            c.request("POST", "/debug/fail", json={"mode": "crash", "on": "generate", "after": 1})
        rt.generate(0)
        samples = rt.load_rollout(0)
        keys = [(s.group_index, s.index) for s in samples]
        assert len(keys) == len(set(keys)) == 16  # nothing lost, nothing twice
        assert sorted(s.index for s in samples) == list(range(16))
        assert {s.weight_versions[0] for s in samples} == {1}
        deadline = time.monotonic() + 120
        while rt.engine.slots[0].url == dead_url and time.monotonic() < deadline:
            time.sleep(0.2)
        assert rt.fleet.restarts == 1 and rt.fleet.launcher.urls[0] != dead_url
        assert rt.engine.engine_versions() == {u: 1 for u in rt.fleet.launcher.urls}  # the new engine has the served weights
        assert _engine_weights_equal_trainer(rt, rt.fleet.launcher.urls[0])
        rt.generate(1)
        assert rt.engine.slots[0].served > 0  # back in the router
        metrics = rt.sync_weights()
        assert metrics["rollout/engine_restarts"] == 1.0 and metrics["perf/update_weights_time"] > 0
        assert rt.fleet.weight_sync._groups == 3  # the first group, the restarted engine's own, then all engines again
    finally:
        rt.close()


def test_colocated_offload_order_disk_mode(tmp_path):
    """Colocated: engines release their memory for the train stage and resume it at the sync (weights,
    then the buckets, then the rest); the engines then hold the trained weights (disk mode)."""
    from miles_core.rollout.http import HTTPEngineClient
    from miles_core.runtime.placement import build_runtime

    cfg = _cfg(tmp_path, rollout_num_gpus=1, colocate=True, update_weight_mode="disk")
    rt = build_runtime(cfg)
    try:
        rt.sync_weights()
        rt.generate(0)
        rt.train(0)
        with HTTPEngineClient(rt.fleet.launcher.urls[0], api_key=rt.fleet.launcher.api_key) as c:
            assert c.server_info()["released"] == ["cuda_graph", "kv_cache", "weights"]  # released during train
            rt.sync_weights()
            info = c.server_info()
        assert info["released"] == [] and info["weight_version"] == "2"
        ev = info["events"]
        i = ev.index("release:cuda_graph,kv_cache,weights")
        assert ev[i + 1 :] == ["resume:weights", "pause:retract", "flush_cache", ev[i + 4], "version:2",
                               "resume:cuda_graph,kv_cache"], ev  # pause_generation_mode's default, then the flush
        assert ev[i + 4].startswith("weights:")  # every tensor from the disk dir, after the resume
        assert _engine_weights_equal_trainer(rt, rt.fleet.launcher.urls[0])
        assert [p.name for p in (cfg.run_dir / "weight_sync").iterdir()] == ["v2"]
        rt.generate(1)  # serves again
        assert {s.weight_versions[0] for s in rt.load_rollout(1)} == {2}
    finally:
        rt.close()

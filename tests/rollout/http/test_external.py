"""External engines (rollout_external_engine_addrs) over real HTTP on 127.0.0.1: the router is probed with the
user's key (MILES_ENGINE_API_KEY) before anything loads, a bad engine fails naming its address, disk-mode weight
syncs reach every engine, and a dead engine is marked dead (never restarted) with its address in the error.
The whole flow over two server processes: tests/e2e/test_external_engines.py."""

from __future__ import annotations

import time

import pytest
import torch

from miles_core.assemble import build_config
from miles_core.config.rollout import API_KEY_ENV
from miles_core.rollout.http import ExternalEngineError, NoHealthyEngine, external_fleet
from miles_core.weights.sync import WeightSender

from http_helpers import requests_for

KEY = "external-" + "k" * 32


def _cfg(tmp_path, urls: list[str], **extra):
    return build_config({"rollout_batch_size": 2, "n_samples_per_prompt": 2, "prompt_data": "builtin://arith",
                         "run_dir": str(tmp_path / "run"), "rollout_external_engine_addrs": urls, **extra})


def _addr(url: str) -> str:
    return url.removeprefix("http://")  # the reference's host:port form


def test_a_wrong_key_or_a_missing_engine_fails_naming_the_address(tmp_path, start_server, monkeypatch):
    good = start_server(api_key=KEY)
    missing = "127.0.0.1:9"  # nothing listens on the discard port
    monkeypatch.setenv(API_KEY_ENV, "not-the-key")
    with pytest.raises(ExternalEngineError, match=rf"{good.url}: .*HTTP 401.*{API_KEY_ENV}"):
        external_fleet(_cfg(tmp_path, [_addr(good.url)]))
    monkeypatch.setenv(API_KEY_ENV, KEY)
    with pytest.raises(ExternalEngineError, match=r"1 of 2 engine\(s\) not usable: http://127.0.0.1:9: health check failed"):
        external_fleet(_cfg(tmp_path, [_addr(good.url), missing]))


@pytest.mark.parametrize("mode", ["disk", "broadcast"])
def test_disk_and_broadcast_syncs_reach_every_engine(tmp_path, start_server, monkeypatch, model_dir, mode):
    """disk: every engine loads the saved dir; broadcast: every engine joins the gloo group this process hosts."""
    from transformers import AutoConfig

    servers = [start_server(api_key=KEY) for _ in range(2)]
    monkeypatch.setenv(API_KEY_ENV, KEY)
    fleet = external_fleet(_cfg(tmp_path, [s.url for s in servers], update_weight_mode=mode))
    try:
        before = fleet.engine.generate(requests_for(4), seed=3)
        new = {k: v + 0.05 for k, v in servers[0].server.engine.model.state_dict().items()}
        metrics = fleet.update_weights(WeightSender(lambda: list(new.items()), AutoConfig.from_pretrained(model_dir)), 1)
        assert metrics["perf/update_weights_time"] > 0 and metrics["rollout/engine_restarts"] == 0
        assert fleet.engine.engine_versions() == {s.url: 1 for s in servers}
        for s in servers:  # every engine holds the new tensors
            got = s.server.engine.model.state_dict()
            assert all(torch.equal(got[k], v) for k, v in new.items())
        if mode == "disk":
            assert [p.name for p in (tmp_path / "run" / "weight_sync").iterdir()] == ["v1"]
        after = fleet.engine.generate(requests_for(4), seed=3)
        assert [r.output_log_probs for r in after] != [r.output_log_probs for r in before]
        assert {r.weight_version for r in after} == {1}
    finally:
        fleet.close()


def test_a_dead_external_engine_is_marked_dead_not_restarted(tmp_path, start_server, monkeypatch, make_client):
    servers = [start_server(api_key=KEY) for _ in range(2)]
    monkeypatch.setenv(API_KEY_ENV, KEY)
    cfg = _cfg(tmp_path, [s.url for s in servers], use_fault_tolerance=True, rollout_health_check_interval=0.1,
               rollout_health_check_timeout=1.0)
    fleet = external_fleet(cfg)
    try:
        make_client(servers[1].url, api_key=KEY).request("POST", "/debug/fail", json={"mode": "error"})
        deadline = time.monotonic() + 10
        while fleet.router.slots[1].healthy and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fleet.router.status()[1]["last_error"] == f"external engine {servers[1].url} failed its health check (miles cannot restart it)"
        assert fleet.restarts == 0 and fleet.router.slots[1].url == servers[1].url  # the same engine, not replaced
        assert len(fleet.engine.generate(requests_for(4), seed=0)) == 4  # the other engine serves everything
        make_client(servers[0].url, api_key=KEY).request("POST", "/debug/fail", json={"mode": "error"})
        deadline = time.monotonic() + 10
        while fleet.router.slots[0].healthy and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(NoHealthyEngine, match=rf"none healthy: {servers[0].url} \(external engine .*; {servers[1].url} "):
            fleet.engine.generate(requests_for(2), seed=0)
    finally:
        fleet.close()

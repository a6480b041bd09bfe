"""HTTPEngineClient against our server: same results as the in-process engine, weights over HTTP,
weights from disk, control calls, and errors that name the URL."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from miles_core.rollout.http import EngineHTTPError, EngineUnreachable
from miles_core.weights.sync import sync_weights

from http_helpers import requests_for, same_results


def perturbed_state_dict(model_dir, seed: int = 1) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    return model.state_dict()


def test_client_equals_in_process_engine_for_the_same_seed(start_server, make_client, make_engine):
    client = make_client(start_server().url)
    reqs = requests_for(6, top_k=30, top_p=0.95) + requests_for(2, temperature=0.7)
    assert same_results(client.generate(reqs, seed=4), make_engine().generate(reqs, seed=4))
    assert client.generate([], seed=4) == []


def test_dynamic_batching_server_gives_the_same_tokens(start_server, make_client, make_engine):
    client = make_client(start_server(batching="dynamic").url)
    reqs = requests_for(6)
    exact = make_engine().generate(reqs, seed=2)
    outs = [None] * 3
    threads = [threading.Thread(target=lambda k=k: outs.__setitem__(k, client.generate(reqs, seed=2))) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for out in outs:  # concurrent calls share decode batches: tokens equal, log-probs within float32 rounding
        assert [r.output_ids for r in out] == [r.output_ids for r in exact]
        assert all(abs(a - b) < 1e-4 for r, e in zip(out, exact) for a, b in zip(r.output_log_probs, e.output_log_probs))


def test_weights_pushed_in_buckets_equal_load_state_dict(start_server, make_client, make_engine, model_dir):
    h = start_server()
    client = make_client(h.url)
    reqs = requests_for(4)
    before = client.generate(reqs, seed=1)
    sd = perturbed_state_dict(model_dir)
    client.begin_weight_update()
    n = client.update_weights_from_tensor(sd.items(), bucket_bytes=40_000)  # ~120 KB of weights
    client.end_weight_update()
    assert n >= 3 and client.server_info()["stats"]["weight_buckets"] == n
    reference = make_engine()
    reference.model.load_state_dict(sd)
    after = client.generate(reqs, seed=1)
    assert not same_results(after, before)
    assert same_results(after, reference.generate(reqs, seed=1))
    for name, t in h.server.engine.model.state_dict().items():
        assert torch.equal(t, sd[name]), name


def test_sync_weights_sequence_over_http(start_server, make_client, model_dir):
    client = make_client(start_server().url, bucket_bytes=50_000)
    metrics = sync_weights(perturbed_state_dict(model_dir).items(), [client], version=1, max_bytes=50_000)
    assert metrics["perf/update_weights_time"] > 0
    assert client.get_weight_version() == 1
    assert {r.weight_version for r in client.generate(requests_for(2), seed=0)} == {1}


def test_bad_buckets_are_refused_whole(start_server, make_client):
    h = start_server()
    client = make_client(h.url)
    before = h.server.engine.model.model.norm.weight.clone()
    client.begin_weight_update()
    with pytest.raises(EngineHTTPError, match="no parameter 'bogus.weight'") as e:
        client.update_weights_from_tensor([("model.norm.weight", before + 1), ("bogus.weight", torch.zeros(2))])
    assert e.value.status == 400
    with pytest.raises(EngineHTTPError, match="shape"):
        client.update_weights_from_tensor([("model.norm.weight", torch.zeros(3))])
    assert torch.equal(h.server.engine.model.model.norm.weight, before)  # nothing applied


def test_update_weights_from_disk(start_server, make_client, make_engine, model_dir, tmp_path):
    client = make_client(start_server().url)
    sd = perturbed_state_dict(model_dir, seed=2)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.load_state_dict(sd)
    model.save_pretrained(tmp_path / "new")
    client.update_weights_from_disk(str(tmp_path / "new"), weight_version=3)
    reference = make_engine()
    reference.model.load_state_dict(sd)
    reference.set_weight_version(3)
    reqs = requests_for(3)
    assert same_results(client.generate(reqs, seed=8), reference.generate(reqs, seed=8))
    with pytest.raises(EngineHTTPError, match="no model.safetensors"):
        client.update_weights_from_disk(str(tmp_path / "missing"))


def test_control_calls(start_server, make_client):
    h = start_server()
    client = make_client(h.url)
    assert client.health() and client.is_miles_server()
    client.flush_cache()
    client.pause_generation()
    assert client.server_info()["paused"]
    client.continue_generation()
    client.release_memory_occupation(["weights", "kv_cache"])
    assert not client.health()
    client.resume_memory_occupation()
    assert not client.health()  # CPU weights were dropped: allocated again, unhealthy until rewritten
    client.update_weights_from_disk(h.server.options.model_path)
    assert client.health()
    client.set_weight_version(5)
    assert client.get_weight_version() == 5


def test_abort_through_the_client(start_server, make_client):
    h = start_server()
    client = make_client(h.url)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", client.generate(requests_for(2, max_new_tokens=900), seed=0)))
    t.start()
    deadline = time.monotonic() + 10
    while client.server_info()["stats"]["running"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    client.abort()
    t.join(10)
    assert [r.finish_reason for r in out["r"]] == ["abort", "abort"]


def test_errors_name_the_url(start_server, make_client):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    dead = make_client(f"http://127.0.0.1:{port}", max_retries=2)
    with pytest.raises(EngineUnreachable, match=f"127.0.0.1:{port}.*after 3 attempts"):
        dead.get_weight_version()
    assert not dead.health()

    h = start_server()
    client = make_client(h.url, timeout_s=0.5)
    client.request("POST", "/debug/fail", json={"mode": "hang", "on": "generate"})
    t0 = time.monotonic()
    with pytest.raises(EngineUnreachable, match=f"{h.url}/generate: no answer"):
        client.generate(requests_for(1), seed=0)
    assert time.monotonic() - t0 < 5 and client.health()  # a stuck request, a live server
    client.request("POST", "/debug/fail", json={"mode": "error"})
    with pytest.raises(EngineHTTPError, match="HTTP 500: injected fault") as e:
        client.get_weight_version()
    assert e.value.status == 500 and e.value.url == h.url + "/model_info" and not client.health()

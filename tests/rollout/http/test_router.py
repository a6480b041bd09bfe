"""EngineRouter over real servers: routing-independent results, least-loaded choice, unhealthy
engines skipped, failed in-flight requests retried elsewhere (none lost or duplicated), weight sync."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from miles_core.rollout.http import EngineRouter, HTTPEngineClient, NoHealthyEngine, spawn_server_process
from miles_core.weights.sync import sync_weights

from http_helpers import requests_for, same_results

FAST = {"timeout_s": 30.0, "health_timeout_s": 3.0, "max_retries": 1, "backoff_s": 0.05}


@pytest.fixture(scope="module", autouse=True)
def server_process(model_dir):
    """A server subprocess spawned when this module starts: its start-up (~3-10 s of imports)
    overlaps the tests above the one that uses it (the last in the file)."""
    proc = spawn_server_process(model_dir, ["--enable-fault-injection", "--num-threads", "1"])
    yield proc
    proc.stop()


@pytest.fixture
def make_router():
    routers = []

    def make(urls, client_kwargs=None, **kw):
        router = EngineRouter.from_urls([u if isinstance(u, str) else u.url for u in urls], {**FAST, **(client_kwargs or {})}, **kw)
        routers.append(router)
        return router

    yield make
    for r in routers:
        r.close()


def wait_until(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def stats(handle) -> dict:
    return handle.server.batcher.completed, handle.server.stats["requests_total"]


def test_results_do_not_depend_on_routing(start_server, make_router, make_engine):
    a, b = start_server(), start_server()
    reqs = requests_for(8)
    expected = make_engine().generate(reqs, seed=21)
    for chunk in (None, 1, 3, 8):
        router = make_router([a, b], chunk_size=chunk)
        assert same_results(router.generate(reqs, seed=21), expected), chunk
    assert stats(a)[0] > 0 and stats(b)[0] > 0  # both engines served


def test_least_loaded_engine_gets_the_next_request(start_server, make_router):
    a, b = start_server(), start_server()
    router = make_router([a, b], chunk_size=3)
    out = {}
    long = threading.Thread(target=lambda: out.setdefault("long", router.generate(requests_for(1, max_new_tokens=900), seed=0)))
    long.start()  # tie at 0 in flight: the first engine
    wait_until(lambda: a.server.batcher.running)
    assert [s["in_flight"] for s in router.status()] == [1, 0]
    router.generate(requests_for(3), seed=1)  # a has 1 in flight, b 0: the chunk of 3 goes to b
    assert stats(b) == (3, 3)
    router.abort()
    long.join(10)
    assert out["long"][0].finish_reason == "abort"
    assert [s["served"] for s in router.status()] == [1, 3]


def test_acquire_picks_fewest_in_flight_among_eligible():
    router = EngineRouter([HTTPEngineClient(f"http://127.0.0.1:{p}") for p in (1, 2, 3)])
    try:
        for slot, n in zip(router.slots, (4, 2, 2)):
            slot.in_flight = n
        assert router._acquire(1, exclude=[]) is router.slots[1]  # 2 < 4; tie 2 vs 2 -> lower index
        assert router._acquire(1, exclude=[]) is router.slots[2]  # slot 1 now has 3
        router.slots[2].healthy = False
        router.weight_version, router.slots[1].version = 5, 4  # slot 1 is stale
        assert router._acquire(1, exclude=[]) is router.slots[0]
        assert router._acquire(1, exclude=[router.slots[0]]) is None
    finally:
        router.close()


def test_unhealthy_engine_is_skipped(start_server, make_router, make_engine):
    a, b, c = start_server(), start_server(), start_server()
    router = make_router([a, b, c], recheck_s=0.0)
    HTTPEngineClient(a.url).request("POST", "/debug/fail", json={"mode": "crash"})
    HTTPEngineClient(c.url).request("POST", "/debug/fail", json={"mode": "error"})
    time.sleep(0.2)
    assert router.check_health() == {a.url: False, b.url: True, c.url: False}
    reqs = requests_for(5)
    assert same_results(router.generate(reqs, seed=3), make_engine().generate(reqs, seed=3))
    assert stats(b)[0] == 5 and stats(c)[0] == 0
    HTTPEngineClient(c.url).request("POST", "/debug/fail", json={"mode": "none"})
    assert router.health() and router.status()[2]["healthy"]  # rechecked (recheck_s=0) and back


@pytest.mark.parametrize("mode", ["crash", "hang", "error"])
def test_failed_in_flight_requests_are_retried_on_another_engine(start_server, make_router, make_engine, mode):
    a, b = start_server(), start_server()
    router = make_router([a, b], client_kwargs={"timeout_s": 1.0}, chunk_size=2)
    HTTPEngineClient(a.url).request("POST", "/debug/fail", json={"mode": mode, "on": "generate"})
    reqs = requests_for(6)
    assert same_results(router.generate(reqs, seed=5), make_engine().generate(reqs, seed=5))
    assert stats(b)[0] == 6 and stats(a)[0] == 0  # each request answered exactly once, by b
    assert [s["healthy"] for s in router.status()] == [False, True]


def test_no_healthy_engine_raises(start_server, make_router):
    a = start_server()
    router = make_router([a])
    HTTPEngineClient(a.url).request("POST", "/debug/fail", json={"mode": "crash", "on": "generate"})
    with pytest.raises(NoHealthyEngine, match="failed on 1 engine"):
        router.generate(requests_for(2), seed=0)


def test_weight_sync_reaches_every_engine_and_a_stale_engine_sits_out(start_server, make_router, make_engine, model_dir):
    a, b = start_server(), start_server()
    router = make_router([a, b], recheck_s=0.0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    sd = model.state_dict()
    router.bucket_bytes = 30_000
    sync_weights(sd.items(), [router], version=1, max_bytes=30_000)
    assert a.server.stats["weight_buckets"] == b.server.stats["weight_buckets"] >= 3
    reference = make_engine()
    reference.model.load_state_dict(sd)
    reference.set_weight_version(1)
    reqs = requests_for(4)
    assert same_results(router.generate(reqs, seed=0), reference.generate(reqs, seed=0))

    HTTPEngineClient(b.url).request("POST", "/debug/fail", json={"mode": "error"})
    sync_weights(sd.items(), [router], version=2, max_bytes=30_000)  # b misses version 2
    HTTPEngineClient(b.url).request("POST", "/debug/fail", json={"mode": "none"})
    assert router.check_health() == {a.url: True, b.url: True}
    assert [s["eligible"] for s in router.status()] == [True, False] and router.engine_versions() == {a.url: 2, b.url: 1}
    served_b = stats(b)[0]
    router.generate(reqs, seed=0)
    assert stats(b)[0] == served_b  # the stale engine got nothing
    sync_weights(sd.items(), [router], version=3, max_bytes=30_000)
    assert [s["eligible"] for s in router.status()] == [True, True]


def test_killed_server_process_request_retried_elsewhere(server_process, start_server, make_router, make_engine):
    proc = server_process.wait_ready()
    assert "listening on " + proc.url in proc.log_tail()
    b = start_server()
    router = make_router([proc.url, b], chunk_size=4)
    HTTPEngineClient(proc.url).request("POST", "/debug/fail", json={"mode": "hang", "on": "generate"})
    reqs = requests_for(4)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", router.generate(reqs, seed=9)))
    t.start()
    wait_until(lambda: router.status()[0]["in_flight"] == 4)
    time.sleep(0.2)  # the request is inside the (hung) server
    proc.kill()
    t.join(20)
    assert proc.proc.returncode == -9
    assert same_results(out["r"], make_engine().generate(reqs, seed=9))
    assert stats(b)[0] == 4 and [s["healthy"] for s in router.status()] == [False, True]


def test_max_in_flight_holds_a_chunk_back_until_requests_come_back():
    router = EngineRouter([HTTPEngineClient(f"http://127.0.0.1:{p}") for p in (1, 2)], max_in_flight=3)
    try:
        first = router._acquire(2, exclude=[])
        got = []
        waiter = threading.Thread(target=lambda: got.append(router._acquire(2, exclude=[])))
        waiter.start()
        time.sleep(0.3)
        assert not got and [s["in_flight"] for s in router.status()] == [2, 0]  # 2 + 2 > 3: held back
        router._release(first, 2, None)
        waiter.join(5)
        assert got == [router.slots[0]]  # room again: the least-loaded engine (a tie: the first)
    finally:
        router.close()
    with pytest.raises(ValueError, match="max_in_flight"):
        EngineRouter([HTTPEngineClient("http://127.0.0.1:1")], max_in_flight=0)


def test_max_in_flight_caps_the_chunks_sent(start_server, make_router, make_engine):
    reqs = requests_for(16, max_new_tokens=4)
    expected = make_engine().generate(reqs, seed=4)
    calls = {}
    for bound in (None, 1):
        a, b = start_server(), start_server()
        assert same_results(make_router([a, b], max_in_flight=bound).generate(reqs, seed=4), expected)
        calls[bound] = a.server.stats["generate_calls"] + b.server.stats["generate_calls"]
    assert calls == {None: 8, 1: 16}  # chunks of 16 / (4 * 2) = 2 requests; with the bound, one request each


def test_an_engine_leaves_routing_after_max_failures_consecutive_failures(start_server, make_router, make_engine):
    a, b = start_server(), start_server()
    router = make_router([a, b], chunk_size=4, max_failures=2)
    HTTPEngineClient(a.url).request("POST", "/debug/fail", json={"mode": "error", "on": "generate"})
    reqs = requests_for(4)
    for healthy in ([True, True], [False, True]):  # each call tries a first (a tie at 0 in flight), then b
        assert same_results(router.generate(reqs, seed=2), make_engine().generate(reqs, seed=2))
        assert [s["healthy"] for s in router.status()] == healthy
    assert stats(b)[0] == 8 and stats(a)[0] == 0


def test_router_and_client_options_follow_the_config():
    from miles_core.config import build_config
    from miles_core.rollout.http.options import client_options, router_options

    base = {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "prompt_data": "builtin://arith"}
    default = build_config(base)
    assert router_options(default, 2)["max_failures"] == 3  # miles_router_health_check_failure_threshold
    assert router_options(default, 2)["max_in_flight"] == 512 * 2  # sglang_server_concurrency * engines
    assert client_options(default, None)["timeout_s"] == 14400.0  # sglang_router_request_timeout_secs
    cfg = build_config({**base, "sglang_server_concurrency": 3, "miles_router_max_connections": 5,
                        "miles_router_health_check_failure_threshold": 1, "miles_router_timeout": 7.5})
    assert router_options(cfg, 2)["max_in_flight"] == 5 and router_options(cfg, 1)["max_in_flight"] == 3  # the lower bound
    assert router_options(cfg, 2)["max_failures"] == 1
    assert router_options(default, 2)["policy"] == "least_loaded"
    assert router_options(build_config({**base, "sglang_router_policy": "round_robin"}), 2)["policy"] == "round_robin"
    assert client_options(cfg, "k")["timeout_s"] == 7.5 and client_options(cfg, "k")["api_key"] == "k"


def test_policy_picks_the_engine_of_each_chunk():
    """sglang_router_policy: round_robin takes the eligible engines in turn whatever their load; least_loaded (None)
    the fewest in flight; power_of_two the less loaded of two drawn; unknown names fail."""
    def picks(policy, n=6):
        router = EngineRouter([HTTPEngineClient(f"http://127.0.0.1:{p}") for p in (1, 2, 3)], policy=policy)
        try:
            router.slots[0].in_flight = 100  # the first engine is busy
            return [router.slots.index(router._acquire(1, exclude=[])) for _ in range(n)]
        finally:
            router.close()

    assert picks("round_robin") == [0, 1, 2, 0, 1, 2]
    assert picks("least_loaded") == [1, 2, 1, 2, 1, 2]
    assert 0 not in picks("power_of_two", 30)  # two of three drawn: the busy one loses whenever drawn
    assert set(picks("random", 30)) == {0, 1, 2}  # load-blind
    with pytest.raises(ValueError, match="router policy 'cache_aware'"):
        EngineRouter([HTTPEngineClient("http://127.0.0.1:1")], policy="cache_aware")


def test_round_robin_splits_chunks_evenly_over_real_servers(start_server, make_router, make_engine):
    a, b = start_server(), start_server()
    reqs = requests_for(6, max_new_tokens=4)
    assert same_results(make_router([a, b], chunk_size=1, policy="round_robin").generate(reqs, seed=8),
                        make_engine().generate(reqs, seed=8))
    assert stats(a) == (3, 3) and stats(b) == (3, 3)

"""The engine API key (SGLang's api_key semantics) over real HTTP on 127.0.0.1: every endpoint but the
probes refuses a request without the key (401); the client, the router and weight sync send it; the
server subprocess takes it from its environment and binds the --host it is given."""

from __future__ import annotations

import httpx
import pytest
import torch

from miles_core.rollout.http import EngineRouter, EngineHTTPError, spawn_server_process
from miles_core.rollout.http.server import OPEN_PATHS, EngineServer
from miles_core.rollout.sglang.launch import new_api_key

from http_helpers import requests_for

KEY = "k-" + "x" * 40
PROCESS_KEY = new_api_key()


@pytest.fixture(scope="module", autouse=True)
def keyed_process(model_dir):
    """A server subprocess spawned when this module starts (its start-up overlaps the tests before the
    last one), given its key the launcher's way; an inherited stale key in the environment must lose."""
    proc = spawn_server_process(model_dir, ["--num-threads", "1"], env={"MILES_ENGINE_API_KEY": "stale"}, api_key=PROCESS_KEY)
    yield proc
    proc.stop()


def _routes() -> list[tuple[str, str]]:
    """(method, path) of every route the server registers (fault injection and metrics on: /debug/fail and /metrics too)."""
    server = EngineServer.__new__(EngineServer)  # app() reads only the options
    server.options = type("O", (), {"max_body_bytes": 2**20, "enable_fault_injection": True, "enable_metrics": True})()
    out = []
    for route in server.app().router.routes():
        method = "POST" if route.method in ("*", "POST", "PUT") else route.method
        out.append((method, route.resource.canonical))
    return sorted(set(out))


ROUTES = _routes()
GUARDED = [r for r in ROUTES if not r[1].startswith(OPEN_PATHS)]


def test_every_route_but_the_probes_is_guarded():
    # the list this test covers is the server's own route table: a new endpoint is guarded unless it is a probe
    # SGLang 0.5.23's decide_request_auth (srt/utils/auth.py:93-104) lets /health*, /ready* and /metrics* through
    assert {p for _, p in ROUTES} - {p for _, p in GUARDED} == {"/health", "/health_generate", "/metrics"}
    assert {"/generate", "/update_weights_from_tensor", "/update_weights_from_distributed", "/release_memory_occupation",
            "/update_weight_version", "/debug/fail", "/abort_request", "/pause_generation"} <= {p for _, p in GUARDED}


def test_a_request_without_the_key_is_refused_401_on_every_guarded_endpoint(start_server):
    h = start_server(api_key=KEY)
    tries = [(None, GUARDED), ("Bearer wrong-key", GUARDED),  # no header, a wrong key: every guarded route
             (f"Basic {KEY}", [("POST", "/generate")]), (KEY, [("POST", "/generate")])]  # another scheme, a bare key
    for header, routes in tries:
        headers = {} if header is None else {"Authorization": header}
        for method, path in routes:
            r = httpx.request(method, h.url + path, json={}, headers=headers, timeout=30)
            assert r.status_code == 401, (header, method, path, r.status_code)
            assert method == "HEAD" or "API key" in r.json()["message"]
    assert h.server.stats["requests_total"] == 0 and not h.server.released and h.server.fault is None  # nothing ran


def test_with_the_key_every_endpoint_answers_and_probes_need_none(start_server):
    h = start_server(api_key=KEY)
    assert httpx.get(h.url + "/health_generate", timeout=30).status_code == 200  # probes: open, as in SGLang
    auth = {"Authorization": f"bearer {KEY}"}  # the scheme is case-insensitive
    for method, path in GUARDED:
        r = httpx.request(method, h.url + path, json={}, headers=auth, timeout=30)
        assert r.status_code != 401, (method, path)


def test_client_router_and_weight_sync_send_the_key(start_server, make_client):
    h = start_server(api_key=KEY)
    with pytest.raises(EngineHTTPError) as e:
        make_client(h.url).get_weight_version()
    assert e.value.status == 401
    with EngineRouter.from_urls([h.url], {"api_key": KEY, "timeout_s": 30.0}) as router:
        out = router.generate(requests_for(2, max_new_tokens=3), seed=1)
        assert len(out[0].output_ids) == 3
        weights = {n: torch.zeros_like(p) for n, p in h.server.engine.model.state_dict().items()}
        router.begin_weight_update()
        router.update_weights_from_tensor(weights.items())
        router.end_weight_update()
        router.set_weight_version(7)
        assert make_client(h.url, api_key=KEY).get_weight_version() == 7
    assert all(bool((p == 0).all()) for p in h.server.engine.model.parameters())


def test_server_binds_the_host_it_is_given(start_server):
    h = start_server(host="127.0.0.2")  # a second loopback address: bound there, not on 127.0.0.1
    assert h.url.startswith("http://127.0.0.2:")
    assert httpx.get(h.url + "/health", timeout=30).status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(h.url.replace("127.0.0.2", "127.0.0.1") + "/health", timeout=5)


def test_server_process_takes_the_key_from_its_environment_not_argv(keyed_process, make_client):
    assert len(PROCESS_KEY) >= 40 and PROCESS_KEY != new_api_key()
    proc = keyed_process.wait_ready()
    assert PROCESS_KEY not in " ".join(proc.cmd) and proc.api_key == PROCESS_KEY
    assert httpx.post(proc.url + "/flush_cache", timeout=30).status_code == 401
    with pytest.raises(EngineHTTPError):
        make_client(proc.url, api_key="stale").flush_cache()  # the caller's key wins over an inherited one
    make_client(proc.url, api_key=PROCESS_KEY).flush_cache()

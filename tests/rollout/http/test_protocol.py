"""Our client and our stand-in server against SGLang 0.5.23's protocol as the wheel has it (the snapshot
miles_core/rollout/sglang/protocol.json, written by tools/sglang_snapshot.py from the wheel's source):
every request the client sends (recorded on the wire while it runs every weight-sync mode and every
control call) is an SGLang route, method and set of request fields; every route the server serves is
SGLang's or on the short list of our own; the session rule answers with SGLang's messages."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import httpx
import pytest
import torch

from http_helpers import requests_for
from miles_core.rollout.http import EngineRouter, HTTPEngineClient
from miles_core.rollout.http.server import EngineServer, ServerOptions
from miles_core.rollout.sglang.protocol import MOUNTED_ROUTES, OUR_ROUTES, Call, protocol, request_problems, route_problems
from miles_core.weights.sync import MODES, DeltaOptions, WeightSender, WeightSync

ROOT = Path(__file__).resolve().parents[3]


def _recorder(calls: list[Call]):
    def record(request: httpx.Request) -> None:
        body = None
        if request.headers.get("content-type", "").startswith("application/json"):
            body = json.loads(request.read() or b"null")
        calls.append(Call(request.method, request.url.path, body))

    return record


@pytest.fixture(scope="module")
def client_calls(tmp_path_factory, model_dir):
    """Every request our client and router send while running each sync mode and each control call."""
    from miles_core.rollout.http import HFEngine, serve_in_thread

    calls: list[Call] = []
    handle = serve_in_thread(HFEngine.from_pretrained(model_dir, batching="exact"), model_path=str(model_dir))
    client = HTTPEngineClient(handle.url, timeout_s=30.0)
    client._http.event_hooks["request"].append(_recorder(calls))
    model = handle.server.engine.model
    sender = WeightSender(lambda: [(k, v.clone()) for k, v in model.state_dict().items()], model.config)
    try:
        with EngineRouter([client]) as router:
            for version, mode in enumerate(MODES, start=1):
                where = tmp_path_factory.mktemp("sync")
                delta = DeltaOptions(str(where / "deltas"), str(where / "local")) if mode == "disk-delta" else None
                WeightSync(mode, 2**20, where, delta=delta).sync(sender, router, version)
            router.generate(requests_for(2, max_new_tokens=2, stop=("x",), top_k=5), seed=0)
            router.check_health()
            router.release_memory_occupation(["kv_cache"])
            router.resume_memory_occupation(["kv_cache"])
            router.abort()
            client.abort("some-rid")
            client.get_weights_by_name("model.norm.weight")
            client.destroy_weights_update_group(next(iter(handle.server.weight_groups)))
    finally:
        client.close()
        handle.stop()
    return calls


def test_the_client_sends_only_sglang_routes_methods_and_fields(client_calls):
    paths = {c.path for c in client_calls}
    assert {"/begin_weight_update", "/end_weight_update", "/model_info", "/init_weights_update_group",
            "/update_weights_from_distributed", "/update_weights_from_disk", "/update_weights_from_tensor",
            "/update_weight_version", "/pause_generation", "/continue_generation", "/generate", "/pull_weights"} <= paths
    assert request_problems(client_calls) == []  # /pull_weights (disk-delta) is one of OUR_ROUTES


def test_a_route_or_field_removed_from_the_snapshot_is_reported(client_calls):
    snap = copy.deepcopy(protocol())
    del snap["routes"]["/model_info"]
    del snap["requests"]["InitWeightsUpdateGroupReqInput"]["rank_offset"]
    del snap["requests"]["SamplingParams"]["sampling_seed"]
    problems = "\n".join(request_problems(client_calls, snap))
    assert "GET /model_info: SGLang 0.5.23 has no such route" in problems
    assert "field 'rank_offset' is not in SGLang's InitWeightsUpdateGroupReqInput" in problems
    assert "sampling_params.sampling_seed is not in SGLang's SamplingParams" in problems


def test_the_old_client_calls_are_refused_by_the_snapshot():
    """What this client sent before SGLang 0.5.23's protocol was followed (finding 1: /get_weight_version)."""
    old = [Call("GET", "/get_weight_version"), Call("POST", "/update_weight_version", {"weight_version": "3"})]
    assert len(request_problems(old)) == 2


def _served(options: ServerOptions) -> list[tuple[tuple[str, ...], str]]:
    app = EngineServer.__new__(EngineServer)
    app.options = options
    table = app.app().router.routes()
    by_path: dict[str, set[str]] = {}
    for r in table:
        if r.method != "HEAD":  # aiohttp adds HEAD to every GET
            by_path.setdefault(r.resource.canonical, set()).add(r.method)
    return [(tuple(sorted(m)), p) for p, m in by_path.items()]


def test_the_server_serves_sglang_routes_and_our_short_list_only():
    served = _served(ServerOptions(enable_fault_injection=True))
    assert route_problems(served) == []
    assert {p for _, p in served} - set(protocol()["routes"]) == set(OUR_ROUTES)
    grown = served + [(("GET",), "/get_weight_version")]
    assert route_problems(grown) == ["/get_weight_version: not an SGLang 0.5.23 route, nor one of ours "
                                     "['/debug/fail', '/pull_weights']"]


def test_the_session_rule_answers_with_sglang_messages(start_server):
    rule = protocol()["session"]
    h = start_server()
    post = lambda path, **kw: httpx.post(h.url + path, timeout=30, **kw)  # noqa: E731
    bucket = {"content": b"", "headers": {"Content-Type": "application/octet-stream"}}
    meta = {"names": [], "dtypes": [], "shapes": [], "group_name": "g"}
    outside = {"update_weights_from_tensor": post("/update_weights_from_tensor", **bucket),
               "update_weights_from_distributed": post("/update_weights_from_distributed", json=meta)}
    assert set(outside) == set(rule["requires_session"])
    for method, r in outside.items():
        assert (r.status_code, r.json()["message"]) == (400, rule["requires_session"][method])
    r = post("/end_weight_update", json={})
    assert (r.status_code, r.json()["message"]) == (400, rule["end_when_closed"])
    assert post("/begin_weight_update", json={}).status_code == 200
    r = post("/begin_weight_update", json={})
    assert (r.status_code, r.json()["message"]) == (400, rule["begin_when_open"])
    assert post("/end_weight_update", json={}).status_code == 200


def test_the_engines_pages_name_only_sglang_routes_or_ours():
    known = set(protocol()["routes"]) | set(OUR_ROUTES) | set(MOUNTED_ROUTES)
    known |= {r.split("/{")[0] for r in known if "/{" in r}  # a templated route (/dumper/{method}) as the pattern reads it
    for page in ("docs/engines.md", "docs/advanced/weight-sync.md"):
        named = set(re.findall(r"`(?:GET |POST |GET\|POST )?(/[a-z_]+(?:/[a-z_]+)?)", (ROOT / page).read_text()))
        assert named and named - known == set(), (page, sorted(named - known))


def test_a_router_over_the_stand_in_finds_it_healthy(start_server):
    """Finding 1: the health probe read /get_weight_version, which SGLang does not have: every engine was unhealthy."""
    h = start_server()
    with EngineRouter.from_urls([h.url]) as router:
        assert router.check_health() == {h.url: True}
        assert router.engine_versions() == {h.url: 0}


def test_update_weights_to_an_engine_in_a_session_changes_what_it_serves(start_server, make_client):
    h = start_server()
    client = make_client(h.url)
    zeros = [(k, torch.zeros_like(v)) for k, v in h.server.engine.model.state_dict().items()]
    client.begin_weight_update()
    client.update_weights_from_tensor(zeros)
    client.end_weight_update()
    assert all(bool((p == 0).all()) for p in h.server.engine.model.parameters())

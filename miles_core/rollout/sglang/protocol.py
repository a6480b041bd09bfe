"""SGLang 0.5.23's HTTP protocol as the snapshot (protocol.json, ``make sglang-snapshot``) records it from the wheel,
and the checks that hold our client and our stand-in server to it (tests/rollout/sglang/test_protocol.py).

    PROTOCOL                               the snapshot: routes -> methods + request class, request fields,
                                           the weight-update session rule, init_custom_process_group's source
    request_problems(calls, snapshot)      calls (method, path, JSON body) a client sent that SGLang lacks
    route_problems(routes, snapshot)       routes a server serves that SGLang lacks (OUR_ROUTES aside)

Our deviations, each on purpose and documented in docs/engines.md: OUR_ROUTES (fault injection, disk-delta's
/pull_weights), and
OUR_BODIES: the body of /update_weights_from_tensor is a safetensors file (SGLang's carries in-process
IPC handles, which cannot cross HTTP).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

SNAPSHOT_FILE = Path(__file__).with_name("protocol.json")
OUR_ROUTES = {"/debug/fail": ("POST",),  # served only with --enable-fault-injection
              "/pull_weights": ("POST",)}  # disk-delta (SGLang serves it after 0.5.23: srt/weight_sync/local_checkpoint.py)
# SGLang's routes mounted rather than decorated (so not in the snapshot's routes): /metrics, prometheus_client's app
# with --enable-metrics (utils/common.py add_prometheus_middleware); our server's: rollout/http/metrics.py
MOUNTED_ROUTES = {"/metrics": ("GET",)}
OUR_BODIES = {"/update_weights_from_tensor": "a safetensors file (Content-Type application/octet-stream)"}


@dataclass(frozen=True)
class Call:
    """One HTTP request as sent: method, path, and the keys of its JSON body (None: no JSON body)."""

    method: str
    path: str
    body: dict[str, Any] | list | None = None


@cache
def protocol() -> dict[str, Any]:
    return json.loads(SNAPSHOT_FILE.read_text())


def _fields(snapshot: dict[str, Any], cls: str | None) -> set[str] | None:
    return None if cls is None else set(snapshot["requests"].get(cls, {}))


def _body_problems(call: Call, snapshot: dict[str, Any]) -> list[str]:
    cls = snapshot["routes"][call.path]["request"]
    fields = _fields(snapshot, cls)
    if call.body is None or fields is None or call.path in OUR_BODIES:
        return []
    if not isinstance(call.body, dict):
        return [f"{call.method} {call.path}: body is not a JSON object"]
    problems = [f"{call.method} {call.path}: field {k!r} is not in SGLang's {cls}" for k in sorted(set(call.body) - fields)]
    params = call.body.get("sampling_params")
    for p in params if isinstance(params, list) else [params] if isinstance(params, dict) else []:
        extra = set(p) - set(snapshot["requests"]["SamplingParams"])
        problems += [f"{call.path}: sampling_params.{k} is not in SGLang's SamplingParams" for k in sorted(extra)]
    return problems


def request_problems(calls: list[Call], snapshot: dict[str, Any] | None = None) -> list[str]:
    """Every route, method and body field of ``calls`` must be SGLang's. -> what is not (empty: all of it is)."""
    snapshot = snapshot or protocol()
    problems = []
    for call in calls:
        route = snapshot["routes"].get(call.path)
        if route is None:
            if call.path not in OUR_ROUTES:
                problems.append(f"{call.method} {call.path}: SGLang {snapshot['sglang_version']} has no such route")
            continue
        if call.method not in route["methods"]:
            problems.append(f"{call.method} {call.path}: SGLang serves it with {route['methods']} only")
            continue
        problems += _body_problems(call, snapshot)
    return sorted(set(problems))


def route_problems(routes: list[tuple[tuple[str, ...], str]], snapshot: dict[str, Any] | None = None) -> list[str]:
    """Every (methods, path) a server serves must be SGLang's, or one of OUR_ROUTES. -> what is not."""
    snapshot = snapshot or protocol()
    problems = []
    for methods, path in routes:
        allowed = snapshot["routes"].get(path, {}).get("methods") or OUR_ROUTES.get(path) or MOUNTED_ROUTES.get(path)
        if allowed is None:
            problems.append(f"{path}: not an SGLang {snapshot['sglang_version']} route, nor one of ours {sorted(OUR_ROUTES)}")
        elif set(methods) - set(allowed):
            problems.append(f"{path}: serves {sorted(set(methods) - set(allowed))}, SGLang only {list(allowed)}")
    return problems

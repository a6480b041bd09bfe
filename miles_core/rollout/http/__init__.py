"""Rollout engines over HTTP, speaking the SGLang protocol (docs/engines.md).

    server.py   EngineServer: an HFEngine behind SGLang's endpoints (aiohttp); CLI entry point
    launch.py   serve_in_thread / launch_server_process
    client.py   HTTPEngineClient: the RolloutEngine protocol against our server or a real SGLang
    router.py   EngineRouter: the RolloutEngine protocol over N clients (least-loaded, failover)
    fleet.py    HTTPFleet: the router as an EngineFleet (weight sync modes, colocate, restarts)
    external.py external_fleet: an HTTPFleet over engines already running (rollout_external_engine_addrs)
    health.py   HealthMonitor: polls the engines, restarts dead ones (use_fault_tolerance)
    engine.py   HF weight files (the disk reload); HFEngine re-exported
    wire.py     the JSON / safetensors formats shared by client and server

Names load lazily, so ``python -m miles_core.rollout.http.server`` runs the module once.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "EngineError": "client", "EngineHTTPError": "client", "EngineUnreachable": "client", "HTTPEngineClient": "client",
    "EngineRouter": "router", "NoHealthyEngine": "router", "EngineServer": "server", "ServerOptions": "server", "SERVER_NAME": "wire",
    "HFEngine": "engine", "request_seed": "engine",
    "ServerHandle": "launch", "ServerProcess": "launch", "launch_server_process": "launch", "serve_in_thread": "launch",
    "spawn_server_process": "launch", "HTTPFleet": "fleet", "HealthMonitor": "health",
    "ExternalEngineError": "external", "external_fleet": "external",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)

"""The SGLang engine fleet is not in the runtime's name tables yet, so config/backends.py refuses
`rollout_engine: sglang` at load. These tests check the pieces that fleet is built from (passthrough
validation, the launch command, the engine process), so they declare the combination for their own
duration. Drop this fixture when ENGINE_SERVERS has its "sglang" entry (SUPPORTED then lists it)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def sglang_declared_for_ray(monkeypatch):
    from miles_core.config import backends

    engines = backends.SUPPORTED["ray"]["rollout_engine"]
    if "sglang" not in engines:
        monkeypatch.setitem(backends.SUPPORTED["ray"], "rollout_engine", engines | {"sglang"})

"""One local Ray for the tests/runtime modules that ask for it (starting Ray takes ~9 s, its shutdown ~1.5 s): package
scope, so it starts at the first of them (after test_ray_nodes, which runs a two-node cluster of its own) and stops after
the last. Every test removes its actors and placement groups, so a module finds the whole cluster free."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="package")
def local_ray():
    import ray

    from miles_core.runtime.ray.session import start_ray

    started = start_ray(None, 4)
    yield
    if started:
        ray.shutdown()

"""One local Ray for the module that asks for it (starting Ray takes seconds)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def local_ray():
    import ray

    from miles_core.runtime.ray.session import start_ray

    started = start_ray(None, 4)
    yield
    if started:
        ray.shutdown()

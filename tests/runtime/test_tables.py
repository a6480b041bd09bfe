"""The name tables: trainers by train_backend, engine fleets by rollout_engine, placements by runtime.
Each table's keys are exactly what the config accepts and says is supported (config/backends.py), and a
combination without an implementation is refused at load, naming the field, never replaced."""

from __future__ import annotations

from typing import get_args

import pytest

from miles_core.config import ConfigError
from flows.recipes import load_config
from miles_core.config.backends import SUPPORTED
from miles_core.config.cluster import ClusterConfig


def _choices(field: str) -> set[str]:
    return set(get_args(ClusterConfig.model_fields[field].annotation))


def test_tables_implement_exactly_the_config_values():
    from miles_core.runtime.local import ENGINE_FLEETS
    from miles_core.runtime.placement import PLACEMENTS
    from miles_core.runtime.ray.engines import ENGINE_SERVERS
    from miles_core.training.backends import TRAINERS

    assert set(PLACEMENTS) == set(SUPPORTED) == _choices("runtime")
    assert set(TRAINERS) == _choices("train_backend")
    assert set(TRAINERS) == set().union(*(t["train_backend"] for t in SUPPORTED.values()))
    assert set(ENGINE_FLEETS) == SUPPORTED["local"]["rollout_engine"]
    assert set(ENGINE_SERVERS) == SUPPORTED["ray"]["rollout_engine"]
    assert set(ENGINE_FLEETS) | set(ENGINE_SERVERS) == _choices("rollout_engine")


@pytest.mark.parametrize("runtime", sorted(SUPPORTED))
def test_a_combination_without_implementation_is_refused_at_load(runtime):
    for field in ("train_backend", "rollout_engine"):
        for value in sorted(_choices(field) - SUPPORTED[runtime][field]):
            with pytest.raises(ConfigError, match=f"{field} {value} is not supported yet with runtime {runtime}"):
                load_config("tiny", {"runtime": runtime, field: value})

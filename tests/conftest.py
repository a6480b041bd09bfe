"""Shared fixtures. Caches and Prefect/MLflow homes stay inside the project (miles_core.env)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("MILES_CACHE_DIR", str(ROOT / ".cache" / "miles"))
os.environ.setdefault("MILES_METRICS_CHECK", "error")  # an uncatalogued metric name fails the suite

from miles_core.env import cache_dir, configure_environment  # noqa: E402

configure_environment()


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The builtin tiny Qwen2 (built once, cached across sessions in .cache/miles)."""
    from miles_core.models import resolve_model_path

    return resolve_model_path("builtin://tiny-qwen2", cache_dir())


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def prefect_harness():
    """One real Prefect test server (ephemeral API on a temp DB) for the whole session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def prefect_api_url(prefect_harness) -> str:
    """The session's Prefect test server, for CLI runs in subprocesses (PREFECT_API_URL): they talk to a
    server that is already up instead of starting an ephemeral API each (~6 s apiece on 2 CPUs)."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()

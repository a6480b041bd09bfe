"""Shared fixtures. Caches and Prefect/MLflow homes stay inside the project (flows/env.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("MILES_CACHE_DIR", str(ROOT / ".cache" / "miles"))
os.environ.setdefault("MILES_METRICS_CHECK", "error")  # an uncatalogued metric name fails the suite

from flows.env import configure_environment  # noqa: E402
from miles_core.env import cache_dir  # noqa: E402

configure_environment()


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The builtin tiny Qwen2 (built once, cached across sessions in .cache/miles)."""
    from miles_core.models import resolve_model_path

    return resolve_model_path("builtin://tiny-qwen2", cache_dir())


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread while a module runs (restored after it): engines and senders share 2 CPUs, spinning thread
    pools slow everyone down, and an in-process engine computes as the engine servers do (--num-threads 1)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def moved_tiny_model(tiny_model_dir):
    """Builds the weight-sync tests' 'trainer': the tiny checkpoint moved (seeded) away from what the engines loaded."""
    import torch
    from transformers import AutoModelForCausalLM

    def build():
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.02)
        return model

    return build


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

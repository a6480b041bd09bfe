"""Live runtimes of this process, by run key. Tasks receive the key, never the objects."""

from __future__ import annotations

from .runtime import Runtime

_RUNTIMES: dict[str, Runtime] = {}


def register(key: str, runtime: Runtime) -> None:
    _RUNTIMES[key] = runtime


def get_runtime(key: str) -> Runtime:
    try:
        return _RUNTIMES[key]
    except KeyError:
        raise KeyError(f"no live runtime for run key {key!r} in this process (known: {sorted(_RUNTIMES)})") from None


def release(key: str) -> None:
    """Forget the runtime and close what it holds (background generation, engine servers, actors)."""
    runtime = _RUNTIMES.pop(key, None)
    if runtime is not None:
        runtime.close()

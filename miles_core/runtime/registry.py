"""Live runtimes of this process, by run key. Tasks receive the key, never the objects."""

from __future__ import annotations

from .local import LocalRuntime

_RUNTIMES: dict[str, LocalRuntime] = {}


def register(key: str, runtime: LocalRuntime) -> None:
    _RUNTIMES[key] = runtime


def get_runtime(key: str) -> LocalRuntime:
    try:
        return _RUNTIMES[key]
    except KeyError:
        raise KeyError(f"no live runtime for run key {key!r} in this process (known: {sorted(_RUNTIMES)})") from None


def release(key: str) -> None:
    """Forget the runtime; one that holds processes (RayRuntime: actors, engine servers) closes them."""
    runtime = _RUNTIMES.pop(key, None)
    close = getattr(runtime, "close", None)
    if close is not None:
        close()

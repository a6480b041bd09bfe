"""Progress observers: the CLI subscribes a progress bar; flows emit after every rollout."""

from __future__ import annotations

from typing import Callable

Observer = Callable[[int, int, dict], None]
_observers: list[Observer] = []


def subscribe(fn: Observer) -> Callable[[], None]:
    _observers.append(fn)
    return lambda: _observers.remove(fn)


def emit(rollout_id: int, num_rollout: int, metrics: dict) -> None:
    for fn in list(_observers):
        fn(rollout_id, num_rollout, metrics)

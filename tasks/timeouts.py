"""A run's task timeouts: ``task_timeouts`` in the config overrides a task's default timeout by its name."""

from __future__ import annotations

from prefect import Task

from miles_core.config import TrainConfig

_TIMED: dict[tuple[int, float], Task] = {}


def timed(task: Task, config: TrainConfig) -> Task:
    """``task`` with the config's timeout for its name (the task itself when the config sets none)."""
    seconds = config.misc.task_timeouts.get(getattr(task, "name", None))
    if seconds is None or not isinstance(task, Task) or seconds == task.timeout_seconds:
        return task  # (a plain function stands in for a task where a bench times the flow's bodies)
    key = (id(task), seconds)
    if key not in _TIMED:  # one copy per (task, timeout): with_options builds a new Task
        _TIMED[key] = task.with_options(timeout_seconds=seconds)
    return _TIMED[key]

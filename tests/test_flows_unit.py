"""Small pure pieces of the flows and tracking layers."""

from __future__ import annotations

from flows.train import due
from miles_core.tracking import flatten, prefix_collisions, sanitize_key


def test_periodic_rule():
    # interval k runs after rollout i when (i+1) % k == 0, or i is the last rollout
    assert [i for i in range(7) if due(3, i, 7)] == [2, 5, 6]
    assert not any(due(None, i, 7) for i in range(7))


def test_sanitize_and_flatten():
    assert sanitize_key("eval/arith-pass@4") == "eval/arith-pass_4"
    assert flatten({"a": {"b": 1, "c": {"d": 2}}, "e": {}}) == {"a.b": 1, "a.c.d": 2, "e": {}}
    assert prefix_collisions(["eval/x", "eval/x/y", "eval/x-z"]) == [("eval/x", "eval/x/y")]


def test_task_timeouts_name_the_pipeline_tasks_and_override_them():
    import pytest

    import flows.evaluate
    import flows.train  # noqa: F401  (every task module imported)
    import tasks.convert
    import tasks.evaluate
    import tasks.export
    import tasks.prepare
    import tasks.stages
    from miles_core.config import ConfigError
    from flows.recipes import load_config
    from miles_core.config.misc import TASK_NAMES
    from prefect import Task
    from tasks.timeouts import timed

    names = {t.name for m in (tasks.convert, tasks.evaluate, tasks.export, tasks.prepare, tasks.stages)
             for t in vars(m).values() if isinstance(t, Task)}
    assert names == set(TASK_NAMES)
    cfg = load_config("tiny", {"task_timeouts": {"generate": 5.0}})
    assert timed(tasks.stages.generate, cfg).timeout_seconds == 5.0
    assert timed(tasks.stages.generate, cfg) is timed(tasks.stages.generate, cfg)  # one copy per (task, timeout)
    assert timed(tasks.stages.train_step, cfg) is tasks.stages.train_step  # unset: the task's default
    with pytest.raises(ConfigError, match="task_timeouts: unknown task genrate"):
        load_config("tiny", {"task_timeouts": {"genrate": 5.0}})
    with pytest.raises(ConfigError, match="task_timeouts: the timeout of save must be > 0"):
        load_config("tiny", {"task_timeouts": {"save": 0}})

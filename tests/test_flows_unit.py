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


def test_debug_exit_after_rollout_stops_the_loop_after_that_many_rollouts_of_this_invocation(monkeypatch):
    """The reference's train loop: break once (rollout_id - start + 1) >= debug_exit_after_rollout, after the
    rollout's whole cycle; a one_step rollout already started is waited for."""
    import types

    import flows.train as train
    from flows.recipes import load_config

    done, waited = [], []

    class Ahead:
        def wait(self, timeout=None):
            waited.append(True)

    def one_rollout(run, i, pending):
        done.append(i)
        return {"rollout/raw_reward": float(i)}, Ahead()

    monkeypatch.setattr(train, "_one_rollout", one_rollout)
    monkeypatch.setattr(train, "create_progress_artifact", lambda **kw: None)
    monkeypatch.setattr(train, "update_progress_artifact", lambda *a, **kw: None)
    monkeypatch.setattr(train, "flush_prefect_logs", lambda: None)
    monkeypatch.setattr(train.progress, "emit", lambda *a: None)
    monkeypatch.setattr(train, "stop_if_interrupted", lambda: None)
    run = types.SimpleNamespace(num_rollout=10, config=load_config("tiny", {"debug_exit_after_rollout": 2}))
    assert [m["rollout/raw_reward"] for m in train._rollout_loop(run, start=3)] == [3.0, 4.0]
    assert done == [3, 4] and waited == [True]
    done.clear()
    run = types.SimpleNamespace(num_rollout=5, config=load_config("tiny", {}))
    assert len(train._rollout_loop(run, start=3)) == 2 and done == [3, 4]  # unset: to num_rollout


def test_save_trigger_sentinel_saves_that_rollout_and_removes_the_file(monkeypatch, tmp_path):
    """The reference's train loop: the sentinel's file existing at a rollout's save point saves that rollout (no
    save_interval here) and is removed; the next rollout is not saved."""
    import types

    import flows.train as train
    from flows.recipes import load_config

    sentinel, stages = tmp_path / "save-now", []

    def timed(task, cfg):
        results = {"generate": {}, "train": types.SimpleNamespace(rollout={}, steps=[]), "save": {}, "update-weights": {}}
        return lambda *a: stages.append(task.name) or results[task.name]

    monkeypatch.setattr(train, "timed", timed)
    monkeypatch.setattr(train, "_track_rollout", lambda *a: None)
    monkeypatch.setattr(train, "_after_sync", lambda *a: None)
    monkeypatch.setattr(train, "stop_if_interrupted", lambda: None)
    tracker = types.SimpleNamespace(flush=lambda: None, log_extra=lambda *a: None, mlflow=types.SimpleNamespace(run_id="r"))
    run = types.SimpleNamespace(key="k", num_rollout=10, tracker=tracker, model_path="m",
                                config=load_config("tiny", {"save_trigger_sentinel": str(sentinel)}))
    saved = []
    for i in range(3):
        if i == 1:
            sentinel.write_text("")
        stages.clear()
        train._one_rollout(run, i, None)
        saved.append("save" in stages)
    assert saved == [False, True, False] and not sentinel.exists()

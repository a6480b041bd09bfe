"""The orchestration bench's direct figure: Prefect's task engine time on the flow's thread (a task call
minus its body), recorded per task run of a real train flow, and nothing left patched afterwards."""

from __future__ import annotations

import pytest


@pytest.mark.usefixtures("prefect_harness")
def test_timed_tasks_records_every_task_run_of_a_real_flow_and_restores_the_flow(tmp_path, monkeypatch, tiny_model_dir):
    from prefect import Task

    import flows.train
    from bench import orchestration

    monkeypatch.setattr(orchestration, "TMP", tmp_path)
    generate_fn = flows.train.generate.fn
    out = orchestration.run_flow(2, "t", {"eval_interval": None, "skip_eval_before_train": True})

    names = out["task_names"]
    assert names.count("generate") == 2 and names.count("train") == 2
    assert names.count("update-weights") == 3  # version 1 before training, then one per rollout
    assert out["task_runs"] == len(names) == len(out["task_engine_s"])
    # Prefect's own part of each call is positive and small next to a rollout (milliseconds, not seconds)
    assert all(0 < e < 1.0 for e in out["task_engine_s"])
    assert len(out["gaps_s"]) == 1 and out["gaps_s"][0] > 0
    # the flow module is back to its tasks, with their own functions
    assert isinstance(flows.train.generate, Task) and flows.train.generate.fn is generate_fn
    assert len(out["task_body_s"]) == len(names)
    per_rollout = [b for n, b in zip(names, out["task_body_s"]) if n in orchestration.PER_ROLLOUT_TASKS]
    assert len(per_rollout) == 7 and all(b > 0 for b in per_rollout)  # (a cached convert has no body: 0)

    loop = orchestration.run_loop(2, "t-loop", {"eval_interval": None, "skip_eval_before_train": True})
    assert loop["task_names"].count("generate") == 2 and loop["task_names"].count("update-weights") == 3
    assert all(b > 0 for n, b in zip(loop["task_names"], loop["task_body_s"]) if n in orchestration.PER_ROLLOUT_TASKS)
    assert isinstance(flows.train.generate, Task) and flows.train.generate.fn is generate_fn

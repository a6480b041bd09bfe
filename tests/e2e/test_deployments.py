"""Operating miles by deployment, end to end on loopback: `miles serve`'s server, work pool, `prefect
deploy` of deployments/prefect.yaml and process worker (a temporary PREFECT_HOME); `prefect
deployment run train/tiny` to Completed with its MLflow run; `eval/nightly` over that save dir
landing eval/step metrics in the same run; the cron schedule producing scheduled runs;
`train/glm4-5` run at debug scale with the recipe's algorithm settings as MLflow params; runs whose
form names no run dir each in a dir and MLflow run of their own; one of them SIGKILLed mid-run (Crashed),
marked FAILED as crashed by its Retry (`prefect flow-run retry`, as the UI's button) before that resumes it
in the same dir and MLflow run to the uninterrupted run's metrics.

Runs are launched together (the worker runs them in parallel) to keep the file near 3 minutes.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

import flows  # noqa: F401  (environment first)
from flows.serve import PREFECT_YAML, render_prefect_yaml
from miles_core.config import TrainConfig
from flows.recipes import list_recipes, load_config

ROOT = Path(__file__).resolve().parents[2]
TINY = {"num_rollout": 2, "rollout_batch_size": 2, "save_interval": 1, "eval_interval": 100, "skip_eval_before_train": True,
        "eval_prompt_data": ["arith", "builtin://arith-test@[0:8]"], "num_threads": 1, "log_samples": 2}
KILL_RM = '''
import os
import signal
from pathlib import Path

from miles_core.rewards import score


def reward(sample):
    """SIGKILLs its own process (the flow run's) at rollout 1 while the arm file exists: a worker lost mid-run."""
    arm = Path(os.environ["MILES_TEST_KILL_ARM"])
    if sample.rollout_id == 1 and arm.exists():
        arm.unlink(missing_ok=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return score("math", sample.response, sample.label)
'''


# ---- the checked-in file ---------------------------------------------------------------------------
def test_prefect_yaml_is_in_sync_with_the_recipes():
    assert PREFECT_YAML.read_text() == render_prefect_yaml(), "stale deployments/prefect.yaml: run `make deployments`"


def test_every_recipe_is_a_deployment_whose_parameters_validate():
    doc = yaml.safe_load(PREFECT_YAML.read_text())
    train = {d["name"]: d for d in doc["deployments"] if d["entrypoint"] == "flows/train.py:train"}
    assert sorted(train) == list_recipes() and {"glm4-5", "glm4-5-debug", "tiny"} <= set(train)
    for name, d in train.items():
        cfg = TrainConfig.model_validate(d["parameters"]["config"])
        assert cfg == load_config(name) and d["work_pool"]["name"] == "miles" and d["enforce_parameter_schema"]
    (nightly,) = [d for d in doc["deployments"] if d["name"] == "nightly"]
    assert nightly["entrypoint"] == "flows/evaluate.py:evaluate" and nightly["schedules"][0]["cron"] == "0 3 * * *"


# ---- a real server and worker -------------------------------------------------------------------------
def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from flows.serve import serve, stop

    tmp = tmp_path_factory.mktemp("served")
    (tmp / "kill_rm.py").write_text(KILL_RM)
    env = {"PREFECT_HOME": str(tmp / "prefect"), "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp), os.environ.get("PYTHONPATH")])),
           "MILES_TEST_KILL_ARM": str(tmp / "armed"), "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2",
           "MILES_RUNS_ROOT": str(tmp / "runs")}
    info = serve(_free_port(), tmp / "serve", env=env, poll_seconds=1)
    sys.path.insert(0, str(tmp))  # configs naming kill_rm are validated here too (extension points resolve at load)
    try:
        yield {**info, "tmp": tmp, "env": {**os.environ, **env, "PREFECT_API_URL": info["url"]}}
    finally:
        sys.path.remove(str(tmp))
        stop(tmp / "serve")


def _client(url: str):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    class _Ctx:
        def __enter__(self):
            self._settings = temporary_settings({PREFECT_API_URL: url})
            self._settings.__enter__()
            self._client = get_client(sync_client=True).__enter__()
            return self._client

        def __exit__(self, *exc):
            self._client.__exit__(*exc)
            self._settings.__exit__(*exc)

    return _Ctx()


def _wait(client, run_id, timeout_s: float = 600):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = client.read_flow_run(run_id)
        if run.state and run.state.is_final():
            return run
        time.sleep(1)
    raise TimeoutError(f"flow run {run_id} not final after {timeout_s}s: {run.state}")


def _run(client, name: str, parameters: dict):
    d = client.read_deployment_by_name(name)
    return client.create_flow_run_from_deployment(d.id, parameters=parameters).id


def _mlflow(run_dir: Path) -> tuple[MlflowClient, str]:
    marker = json.loads((run_dir / "mlflow_run.json").read_text())
    return MlflowClient(marker["tracking_uri"]), marker["run_id"]


def test_launch_evaluate_schedule_and_retry_by_deployment(served):
    tmp = served["tmp"]
    tiny = load_config("tiny", {**TINY, "run_dir": str(tmp / "tiny")})
    glm = load_config("glm4-5-debug", {"run_dir": str(tmp / "glm"), "num_threads": 1})
    # a Custom run (a changed field, no run dir) whose flow-run process is SIGKILLed at rollout 1 (its reward)
    killed = load_config("tiny", {**TINY, "custom_rm_path": "kill_rm:reward"}).model_dump(mode="json")
    (tmp / "armed").touch()
    cli = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run", "train/tiny",
                          "--params", json.dumps({"config": tiny.model_dump(mode="json")})],
                         cwd=ROOT, env=served["env"], capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    tiny_run = re.search(r"flow-run/([0-9a-f-]{36})", cli.stdout).group(1)

    with _client(served["url"]) as client:
        # train/glm4-5 at debug scale: the glm4-5 deployment with the debug-scale config as its parameters
        glm_run = _run(client, "train/glm4-5", {"config": glm.model_dump(mode="json")})
        killed_run = _run(client, "train/tiny", {"config": killed})
        # two runs of train/tiny whose form names no run dir: two flow runs, two run dirs, two MLflow runs
        own = load_config("tiny", TINY).model_dump(mode="json")
        own_runs = [_run(client, "train/tiny", {"config": own}) for _ in range(2)]

        # the run form (the deployment's parameter schema on the server) leads with the most edited fields
        defs = client.read_deployment_by_name("train/tiny").parameter_openapi_schema["definitions"]
        assert list(defs["TrainConfig"]["properties"])[:2] == ["rollout", "algo"]
        assert list(defs["RolloutConfig"]["properties"])[0] == "num_rollout" and list(defs["AlgoConfig"]["properties"])[0] == "lr"

        # the cron schedule is accepted and the scheduler creates its runs (no waiting for 03:00)
        nightly = client.read_deployment_by_name("eval/nightly")
        assert [s.schedule.cron for s in nightly.schedules] == ["0 3 * * *"] and nightly.schedules[0].active
        scheduled = _scheduled_runs(client, nightly.id)
        assert scheduled and all(r.expected_start_time.hour == 3 and r.expected_start_time.minute == 0 for r in scheduled)

        # train/tiny completes; its MLflow run is finished with every rollout
        assert _wait(client, tiny_run).state.is_completed()
        mlflow, run_id = _mlflow(tiny.run_dir)
        run = mlflow.get_run(run_id)
        assert run.info.status == "FINISHED" and run.data.params["rollout.rollout_batch_size"] == "2"
        assert [m.step for m in mlflow.get_metric_history(run_id, "rollout/raw_reward")] == [0, 1]
        assert sorted(m.step for m in mlflow.get_metric_history(run_id, "eval/step")) == [3]  # the last rollout only
        uninterrupted = _history(mlflow, run_id)

        # each run of its own trained in runs/tiny/<flow-run name>, into its own MLflow run of the deployment's store
        dirs = [tmp / "runs" / "tiny" / _wait(client, r).name for r in own_runs]
        assert all(_wait(client, r).state.is_completed() for r in own_runs) and dirs[0] != dirs[1]
        own_mlflow = [_mlflow(d) for d in dirs]
        assert own_mlflow[0][1] != own_mlflow[1][1] and own_mlflow[0][0].tracking_uri == own_mlflow[1][0].tracking_uri
        for (c, rid), d in zip(own_mlflow, dirs):
            assert [m.step for m in c.get_metric_history(rid, "rollout/raw_reward")] == [0, 1]
            assert (d / "checkpoints").is_dir() and c.get_run(rid).info.status == "FINISHED"

        # eval/nightly over its save dir: the checkpoint of rollout 0 (weight version 2) lands in the same run
        eval_run = _run(client, "eval/nightly", {"target": str(tiny.save_dir), "which": "all"})
        assert _wait(client, eval_run).state.is_completed()
        assert sorted(m.step for m in mlflow.get_metric_history(run_id, "eval/step")) == [2, 3]
        assert {m.step: m.value for m in mlflow.get_metric_history(run_id, "eval/arith/weight_version/mean")} == {2: 2.0, 3: 3.0}

        # the SIGKILLed Custom run: Crashed, in a dir of its own, its MLflow run left RUNNING (no hook ran) ...
        crashed = _wait(client, killed_run)
        kdir = tmp / "runs" / "tiny" / crashed.name
        assert crashed.state.is_crashed(), crashed.state
        assert kdir not in dirs and not (tmp / "armed").exists()
        kmlflow, krun_id = _mlflow(kdir)
        assert kmlflow.get_run(krun_id).info.status == "RUNNING" and kmlflow.get_run(krun_id).data.params["rollout.custom_rm_path"] == "kill_rm:reward"
        first_rollout = (kdir / "rollouts" / "0.pt").stat().st_mtime_ns
        # ... the rollout it died in lost at most its own logs: rollout 0's were flushed to Prefect before it
        logs_before = _logs(client, killed_run)
        assert [m.split(":")[0] for _, m, _ in logs_before if re.match(r"rollout \d", m)] == ["rollout 0 (1/2)"], logs_before
        # ... and a Retry (from the CLI, as the UI's button) resumes it in the same dir and MLflow run ...
        retry = subprocess.run([sys.executable, "-m", "prefect", "flow-run", "retry", str(killed_run)], cwd=ROOT, env=served["env"],
                               capture_output=True, text=True, timeout=300)
        assert retry.returncode == 0, retry.stdout + retry.stderr
        assert _wait(client, killed_run).state.is_completed()
        assert json.loads((kdir / "mlflow_run.json").read_text())["run_id"] == krun_id and kmlflow.get_run(krun_id).info.status == "FINISHED"
        assert (kdir / "rollouts" / "0.pt").stat().st_mtime_ns == first_rollout  # rollout 0 was not redone
        # ... with the uninterrupted run's metrics (same config, the same reward as the built-in math one), none twice
        assert _history(kmlflow, krun_id) == uninterrupted
        # ... having marked the dead run FAILED as crashed before the Retry's first rollout
        (mark,) = [(t, m) for t, m, _ in _logs(client, killed_run) if "left RUNNING by a flow run that died" in m]
        assert "miles.failure=crashed, resume from rollout 1" in mark[1]
        assert mark[0] < _task_run(client, killed_run, "generate-r1").start_time  # the Retry's (the latest) generate of rollout 1

        # train/glm4-5 at debug scale completed; its MLflow run carries the recipe's algorithm settings
        assert _wait(client, glm_run).state.is_completed()
        gmlflow, grun_id = _mlflow(glm.run_dir)
        params = gmlflow.get_run(grun_id).data.params
        want = {"algo.advantage_estimator": "gspo", "algo.use_tis": "true", "algo.eps_clip": "0.0001", "algo.eps_clip_high": "0.0002",
                "algo.kl_loss_type": "low_var_kl", "algo.lr": "1e-06", "algo.weight_decay": "0.1", "algo.num_steps_per_rollout": "4",
                "rollout.rm_type": "deepscaler", "rollout.rollout_temperature": "1.0", "checkpoint.hf_checkpoint": "builtin://glm4-5-debug",
                "misc.recipe": "glm4-5-debug"}
        assert {k: params.get(k) for k in want} == want
        assert [m.step for m in gmlflow.get_metric_history(grun_id, "rollout/raw_reward")] == [0, 1]


def test_stop_ends_worker_and_server(served):
    from flows.serve import _alive, running, stop

    # Prefect's process worker outlives its SIGINT by tens of seconds even with no flow run left; an idle one is
    # killed after IDLE_WORKER_GRACE_S, not the 30 s default grace (no time bound asserted: the machine may be busy)
    stopped = stop(served["dir"])
    assert [s.split()[0] for s in stopped] == ["worker", "server"]
    assert not running(served["dir"]) and not _alive(served["worker_pid"]) and not _alive(served["server_pid"])
    assert stop(served["dir"]) == []  # nothing left to stop


def _history(client, run_id) -> dict[str, list[tuple[int, float]]]:
    """Every metric's (step, value) history but timings."""
    keys = [k for k in client.get_run(run_id).data.metrics if not k.startswith("perf/") and k != "eval/duration_seconds"]
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in keys}


def _logs(client, flow_run_id) -> list[tuple]:
    """The flow run's Prefect logs, oldest first: (timestamp, message, task run id)."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return sorted((e.timestamp, e.message, e.task_run_id) for e in logs)


def _task_run(client, flow_run_id, name: str):
    """The flow run's latest task run of that name."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, TaskRunFilter, TaskRunFilterName

    runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
                                 task_run_filter=TaskRunFilter(name=TaskRunFilterName(any_=[name])))
    return max(runs, key=lambda r: r.start_time)


def _scheduled_runs(client, deployment_id, timeout_s: float = 60):
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    deadline = time.monotonic() + timeout_s
    while True:
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))
        scheduled = [r for r in runs if r.state and r.state.is_scheduled()]
        if scheduled or time.monotonic() > deadline:
            return scheduled
        time.sleep(1)

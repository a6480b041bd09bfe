"""What a user sees of a tiny train run, through the real Prefect API, the real MLflow store and the
real tracker libraries: plots under MLflow plots/ (one reward point per rollout), the Prefect summary
with the MLflow run link and the plots, the MLflow run tagged with its flow run, readable Prefect
logs and task-run names, W&B (offline) / TensorBoard / Prometheus beside MLflow; then a resume that
duplicates no step on any tracker."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
from mlflow.tracking import MlflowClient
from prefect import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogHandler

import flows  # noqa: F401  (environment first)
from flows.recipes import load_config
from miles_core.tracking import progress
from miles_core.tracking.plots import read_series
from miles_core.tracking.tensorboard_tracker import read_scalars
from miles_core.tracking.wandb_tracker import RECORD, read_history

UI = "http://127.0.0.1:5000"


def _config(tmp_path, num_rollout: int):
    return load_config("tiny", {
        "run_dir": str(tmp_path / "run"), "num_rollout": num_rollout, "rollout_batch_size": 4, "eval_interval": 2,
        "eval_prompt_data": ["arith", "builtin://arith-test@[0:16]"], "export_interval": 2, "registered_model_name": "obs-tiny",
        "champion_metric": "eval/arith", "use_wandb": True, "wandb_mode": "offline", "use_tensorboard": True,
        "use_prometheus": True, "prometheus_port": 0, "mlflow_ui_url": UI, "num_threads": 1})


async def _prefect(flow_run_id: str):
    async with get_client() as client:
        (artifact,) = await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["train-summary"])),
                                                  flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
        tasks = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return artifact, [entry.message for entry in logs], {t.name for t in tasks}


def _train(cfg, scraped: list) -> tuple[str, dict]:
    from flows.train import train

    def scrape(i: int, n: int, metrics: dict) -> None:  # during the run, after each rollout
        marker = json.loads((cfg.run_dir / "mlflow_run.json").read_text())
        url = MlflowClient(marker["tracking_uri"]).get_run(marker["run_id"]).data.tags["miles.prometheus"]
        scraped.append((i, urllib.request.urlopen(url, timeout=10).read().decode()))

    unsubscribe = progress.subscribe(scrape)
    try:
        state = train(cfg, return_state=True)
    finally:
        unsubscribe()
    APILogHandler().flush()
    return str(state.state_details.flow_run_id), state.result()


@pytest.mark.usefixtures("prefect_harness")
def test_a_tiny_run_is_visible_in_every_tracker_and_ui(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, 2)
    scraped: list = []
    flow_run_id, summary = _train(cfg, scraped)
    client = MlflowClient(cfg.tracking_uri)
    run = client.get_run(summary["mlflow_run_id"])

    # the MLflow run names and points at its flow run; the experiment is of kind model training
    assert run.data.tags["prefect.flow_run_id"] == flow_run_id and run.info.run_name.startswith("tiny · ")
    assert run.data.tags["prefect.flow_run_name"] in run.info.run_name and run.data.tags.get("mlflow.source.git.commit")
    assert run.data.tags["mlflow.source.name"] == "flows/train.py" and run.data.tags["mlflow.source.type"] == "JOB"
    assert client.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"

    # plots under plots/: real PNGs; the reward curve has one point per rollout, the eval curve one per eval point
    local = client.download_artifacts(run.info.run_id, "plots", str(tmp_path / "dl"))
    from PIL import Image

    for name in ("reward", "response_length", "truncation", "optimization", "mismatch"):
        with Image.open(f"{local}/{name}.png") as img:
            assert img.format == "PNG" and img.size[0] >= 600 and img.size[1] >= 250, (name, img.size)
    series = read_series(tmp_path / "dl" / "plots" / "reward.png")
    assert [s for s, _ in series["rollout/raw_reward"]] == [0, 1] and [s for s, _ in series["eval/arith"]] == [1, 3]

    # the Prefect summary links the MLflow run, lists the best eval, the export and the champion, shows the plots
    artifact, logs, task_names = asyncio.run(_prefect(flow_run_id))
    md = artifact.data
    assert f"[{run.info.run_id}]({UI}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}?workflowType=machine_learning)" in md
    assert "## Best eval" in md and "- arith: **" in md and "rollout_id=1" in md and "champion: obs-tiny v1" in md
    assert md.count("](data:image/png;base64,") == 5

    # readable Prefect logs; task runs named after their rollout
    assert any(m.startswith("rollout 0 (1/2): reward ") and "step time" in m for m in logs), logs
    assert any(m.startswith("rollout 1 (2/2): reward ") for m in logs) and any(m.startswith("eval at eval/step 3: arith ") for m in logs)
    assert any(m.startswith("checkpoint of rollout 1 saved") for m in logs) and any(m.startswith("export of rollout 1:") for m in logs)
    assert {"generate-r0", "generate-r1", "train-r0", "train-r1", "save-r1", "export-r1"} <= task_names, task_names

    # Prometheus served the run's metrics on 127.0.0.1 while it ran
    assert [i for i, _ in scraped] == [0, 1] and "miles_rollout_raw_reward{" in scraped[0][1]
    assert 'miles_rollout_step{run_id="%s",run_name="%s"} 1.0' % (run.info.run_id, run.info.run_name) in scraped[1][1]

    # resume with one rollout more: no step twice on MLflow, W&B (the same run) or TensorBoard
    wandb_id = json.loads((cfg.run_dir / RECORD).read_text())["run_id"]
    flow_run_2, summary_2 = _train(_config(tmp_path, 3), [])
    assert summary_2["mlflow_run_id"] == run.info.run_id and summary_2["resumed_from"] == 2
    rows = read_history(cfg.run_dir, wandb_id)
    tensorboard = read_scalars(cfg.run_dir / "tensorboard" / run.info.run_id)
    for axis, steps in (("rollout/step", [0, 1, 2]), ("train/step", [0, 1, 2]), ("eval/step", [1, 3, 4])):
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, axis)) == steps, axis
    for axis, key, steps in (("rollout/step", "rollout/raw_reward", [0, 1, 2]),
                             ("train/step", "train/loss", [0, 1, 2]), ("eval/step", "eval/arith", [1, 3, 4]),
                             ("rollout/step", "perf/save_model_time", [1, 2])):  # saved after the last rollout of each run
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) == steps, key
        assert [s for s, _ in tensorboard[key]] == steps, key
        assert [r[axis] for r in rows if key in r] == steps, key  # each W&B point of a key at its axis step, once
    assert json.loads((cfg.run_dir / RECORD).read_text())["run_id"] == wandb_id
    _, logs_2, _ = asyncio.run(_prefect(flow_run_2))
    assert any(m.startswith(f"resuming MLflow run {run.info.run_id}") for m in logs_2), logs_2


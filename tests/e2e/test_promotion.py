"""The manual promotion gate through the real Prefect API and MLflow registry: an export that beats
the champion pauses the flow run (a form waiting for input); approved via the API the alias moves,
rejected it stays, and with no answer within promotion_timeout it stays and the flow run completes. A version
registered before the eval of its weights is gated when that eval lands (judge_pending)."""

from __future__ import annotations

import threading
import time

import pytest
from mlflow.tracking import MlflowClient
from prefect import flow, get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
from prefect.client.schemas.objects import StateType
from prefect.flow_runs import resume_flow_run

from flows.promotion import judge_pending, register_export
from flows.recipes import load_config
from miles_core.evaluation import PointResult
from miles_core.tracking import MlflowTracker

MODEL = "gate-tiny"


@flow
def _gate_flow(config, run_id: str, export_path: str, rollout_id: int, eval_step: int) -> dict:
    return register_export(config, run_id, export_path, rollout_id, eval_step)


@flow
def _judge_flow(config, run_id: str, step: int, value: float) -> list[str]:
    return judge_pending(config, run_id, config.tracking_uri, PointResult(step, {"eval/arith": value}))


def _start(target, *args) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(target(*args)), daemon=True)
    thread.start()
    return thread, out


def _paused(timeout: float = 90.0):
    """The flow run of this test that is paused (the only one in the session)."""
    paused = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED])))
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            runs = client.read_flow_runs(flow_run_filter=paused)
            if runs:
                (run,) = runs
                return run
            time.sleep(0.5)
    raise AssertionError("the flow run never paused")


def _eval(tracker: MlflowTracker, step: int, value: float) -> None:
    tracker.log_metrics({"eval/arith": value, "eval/arith/truncated_ratio": 0.0, "eval/step": step}, step=step)


@pytest.mark.usefixtures("prefect_harness")
def test_manual_gate_pauses_and_moves_the_alias_only_when_approved(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_config("tiny", {"run_dir": str(tmp_path / "run"), "mlflow_tracking_uri": store, "export_interval": 1,
                               "registered_model_name": MODEL, "champion_metric": "eval/arith", "promotion_gate": "manual",
                               "promotion_timeout": 60})
    tracker = MlflowTracker(store, "gate", artifact_location=(tmp_path / "mlruns").as_uri())
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text("{}")
    client = MlflowClient(store)

    _eval(tracker, 1, 0.3)
    thread, out = _start(_gate_flow, cfg, tracker.run_id, str(export), 0, 1)  # judged at eval/step 1
    paused = _paused()
    assert paused.state.state_details.run_input_keyset  # paused waiting for the approve/reject form
    assert not client.get_registered_model(MODEL).aliases  # nothing moved while it waits
    resume_flow_run(paused.id, run_input={"approve": True})
    thread.join(90)
    assert out and out[0]["champion"] is True and str(client.get_model_version_by_alias(MODEL, "champion").version) == "1"

    _eval(tracker, 2, 0.5)  # better again: a candidate, rejected
    thread, out = _start(_gate_flow, cfg, tracker.run_id, str(export), 1, 2)
    resume_flow_run(_paused().id, run_input={"approve": False})
    thread.join(90)
    assert out and str(out[0]["version"]) == "2" and out[0]["candidate"] is True and out[0]["champion"] is False
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == "1"

    quick = cfg.model_copy(update={"checkpoint": cfg.checkpoint.model_copy(update={"promotion_timeout": 3})})
    thread, out = _start(_gate_flow, quick, tracker.run_id, str(export), 2, 2)  # nobody answers
    thread.join(90)
    assert out and out[0]["candidate"] is True and out[0]["champion"] is False
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == "1"

    # registered before its eval (eval/step 4 has not run): no pause, judged when the eval lands
    pending = _gate_flow(cfg, tracker.run_id, str(export), 3, 4)
    assert str(pending["version"]) == "4" and pending["candidate"] is False and pending["champion"] is False
    assert client.get_model_version(MODEL, "4").tags["miles.champion_pending"]
    thread, out = _start(_judge_flow, cfg, tracker.run_id, 4, 0.9)  # the eval of its weights lands, better
    resume_flow_run(_paused().id, run_input={"approve": True})
    thread.join(90)
    assert out == [["4"]] and str(client.get_model_version_by_alias(MODEL, "champion").version) == "4"
    assert "miles.champion_pending" not in client.get_model_version(MODEL, "4").tags


"""MlflowTracker: asynchronous metric batches are on the store after flush (and after end)."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from flows.env import long_lived_server_env
from miles_core.tracking import MlflowTracker


def test_asynchronous_metrics_are_on_the_store_after_flush_and_end(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MlflowTracker(uri, "async-test", artifact_location=(tmp_path / "mlruns").as_uri(), asynchronous=True)
    for i in range(5):
        tracker.log_metrics({"rollout/raw_reward": 0.1 * i, "rollout/step": i}, step=i)
    tracker.flush()
    reader = MlflowClient(uri)  # another client: what a resumed run or the UI reads
    assert [m.step for m in reader.get_metric_history(tracker.run_id, "rollout/raw_reward")] == [0, 1, 2, 3, 4]
    tracker.log_metrics({"rollout/raw_reward": 0.5, "rollout/step": 5}, step=5)
    tracker.end("FINISHED")  # flushes first
    assert len(reader.get_metric_history(tracker.run_id, "rollout/step")) == 6
    assert reader.get_run(tracker.run_id).info.status == "FINISHED"


def test_synchronous_tracker_has_nothing_to_flush(tmp_path):
    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "sync-test", artifact_location=(tmp_path / "mlruns").as_uri())
    tracker.log_metrics({"rollout/step": 0}, step=0)
    assert tracker._pending == []
    assert tracker.metric_history("rollout/step") == [(0, 0.0)]


def test_a_long_lived_server_keeps_automations_and_the_event_stream():
    env = {"PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false", "PREFECT_SERVER_EVENTS_STREAM_OUT_ENABLED": "true", "X": "1",
           "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED": "false"}
    # miles' ephemeral-only "false" is dropped (the server's own default applies); anything else stays
    assert long_lived_server_env(env) == {"PREFECT_SERVER_EVENTS_STREAM_OUT_ENABLED": "true", "X": "1"}

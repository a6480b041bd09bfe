"""Champion judging in the real MLflow registry (SQLite): by the metric at the export's own eval step,
a version whose eval has not run yet waits (pending) and is judged when it lands; crown=False (the
manual promotion gate) judges the same way and leaves the alias to set_champion."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from miles_core.tracking import MlflowTracker
from miles_core.tracking.registry import PENDING_TAG, crown_pending, log_export, set_champion

MODEL = "reg-tiny"


def _setup(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MlflowTracker(store, "registry", artifact_location=(tmp_path / "mlruns").as_uri())
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text("{}")
    return store, tracker, export


def _export(store, tracker, export, rollout_id: int, eval_step: int, crown: bool = True):
    return log_export(store, tracker.run_id, export, rollout_id, rollout_id + 1, MODEL, "eval/arith", eval_step, crown)


def _champion(client) -> str:
    return str(client.get_model_version_by_alias(MODEL, "champion").version)


def test_champion_by_eval_step_pending_and_gated(tmp_path):
    store, tracker, export = _setup(tmp_path)
    client = MlflowClient(store)
    tracker.log_metrics({"eval/arith": 0.4}, step=2)
    tracker.log_metrics({"eval/arith": 0.9}, step=5)  # a newer eval of other weights: not what version 1 is judged by
    first = _export(store, tracker, export, 0, 2)
    assert first.champion and first.candidate and not first.pending and _champion(client) == "1"

    waiting = _export(store, tracker, export, 1, 3)  # no eval at step 3 yet
    assert waiting.pending and not waiting.candidate and PENDING_TAG in client.get_model_version(MODEL, "2").tags
    assert crown_pending(store, tracker.run_id, MODEL, "eval/arith", 3, 0.3) == []  # worse than 0.4: judged, not crowned
    assert _champion(client) == "1" and PENDING_TAG not in client.get_model_version(MODEL, "2").tags

    gated = _export(store, tracker, export, 2, 5, crown=False)  # 0.9 beats 0.4: a candidate, the alias waits
    assert gated.candidate and not gated.champion and _champion(client) == "1"
    _export(store, tracker, export, 3, 6, crown=False)
    _export(store, tracker, export, 4, 6, crown=False)  # two versions of the same weights
    assert crown_pending(store, tracker.run_id, MODEL, "eval/arith", 6, 0.95, crown=False) == ["4"]  # the first only
    assert _champion(client) == "1"
    set_champion(store, MODEL, "4")
    assert _champion(client) == "4"
    assert crown_pending(store, tracker.run_id, MODEL, "eval/arith", 6, 0.95) == []  # nothing left pending at step 6


def test_a_lora_export_is_registered_with_its_adapter_and_base_model(tmp_path):
    store, tracker, export = _setup(tmp_path)
    (export / "adapter").mkdir()
    (export / "adapter" / "adapter_config.json").write_text('{"r": 8, "base_model_name_or_path": "builtin://tiny-qwen2"}')
    r = log_export(store, tracker.run_id, export, 0, 1, MODEL, None)
    tags = MlflowClient(store).get_model_version(MODEL, r.version).tags
    assert tags["lora.base_model"] == "builtin://tiny-qwen2" and tags["lora.rank"] == "8"
    assert tags["lora.adapter"] == f"{r.artifact_uri}/adapter"

"""The run form (Prefect renders the flow parameter's JSON schema): the fields a user edits most lead it
(``form_first``), while the config's own field order (dumps, MLflow params, generated docs) stays."""

from __future__ import annotations

from miles_core.config import TrainConfig
from flows.recipes import load_config


def test_the_schema_leads_with_the_most_edited_fields_and_the_config_keeps_its_order():
    schema = TrainConfig.model_json_schema()
    defs = schema["$defs"]
    assert list(schema["properties"])[:4] == ["rollout", "algo", "misc", "tracking"]
    assert list(defs["RolloutConfig"]["properties"])[:2] == ["num_rollout", "rollout_batch_size"]
    assert list(defs["AlgoConfig"]["properties"])[0] == "lr"
    assert list(defs["MiscConfig"]["properties"])[0] == "run_dir"
    assert list(defs["TrackingConfig"]["properties"])[0] == "mlflow_new_run"
    assert set(schema["properties"]) == set(TrainConfig.model_fields)  # reordered, nothing dropped
    assert list(load_config("tiny").model_dump())[:2] == ["cluster", "rollout"]  # the config's order is its own

"""env_report: set (JSON or base64 JSON, the reference's two forms), the run's driver collects its pip packages and the
git state of its editable packages (this checkout: miles is installed editable), prints ENV_REPORT_JSON=..., and
logs it to a real MLflow store (params + artifact) and the W&B config (offline); empty, nothing is collected."""

from __future__ import annotations

import base64
import json

import pytest

import flows  # noqa: F401  (environment first)
from flows.recipes import load_config
from miles_core.tracking.env_report import PREFIX, collect

LAUNCHER = {"flavor": "ci", "nodes": 2}


def test_an_empty_report_collects_nothing():
    cfg = load_config("tiny", {"env_report": ""})
    assert cfg.misc.launcher_env_report is None and collect(cfg.misc.launcher_env_report) is None


def test_both_forms_decode_to_the_launchers_report():
    assert load_config("tiny", {"env_report": json.dumps(LAUNCHER)}).misc.launcher_env_report == LAUNCHER
    encoded = load_config("tiny", {"env_report": base64.b64encode(json.dumps(LAUNCHER).encode()).decode()})
    report = collect(encoded.misc.launcher_env_report)
    assert report.launcher_env_report == LAUNCHER and report.role == "driver"
    names = {p["name"] for p in report.full_pip_list}
    assert {"torch", "mlflow"} <= names
    assert "miles" in {p["name"] for p in report.editable_packages}


def test_the_report_lands_in_mlflow_and_the_wandb_config(tmp_path, capsys, monkeypatch):
    from mlflow.tracking import MlflowClient

    from flows.tracking import open_run

    monkeypatch.setenv("MILES_SCRIPT_ENV_REPORT", json.dumps(LAUNCHER))  # the reference's default source
    cfg = load_config("tiny", {"run_dir": str(tmp_path / "run"), "use_wandb": True, "wandb_mode": "offline"})
    assert json.loads(cfg.misc.env_report) == LAUNCHER
    run = open_run(cfg, None, {})
    try:
        wandb_config = dict(next(m for m in run.mirrors if m.name == "wandb").run.config)
    finally:
        run.end()
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(PREFIX))
    printed = json.loads(line.removeprefix(PREFIX))
    assert printed["launcher_env_report"] == LAUNCHER
    client = MlflowClient(cfg.tracking_uri)
    params = client.get_run(run.mlflow.run_id).data.params
    assert params["launcher_env_report.flavor"] == "ci" and params["launcher_env_report.nodes"] == "2"
    assert any(k.startswith("env_report.git.miles.commit") for k in params)
    artifact = client.download_artifacts(run.mlflow.run_id, "env_report/driver_0.json", str(tmp_path / "dl"))
    assert json.loads(open(artifact).read()) == printed
    assert wandb_config["launcher_env_report.flavor"] == "ci"


@pytest.mark.parametrize("raw", ["[1, 2]", "not json", base64.b64encode(b"[1]").decode()])
def test_a_report_that_is_no_json_object_is_refused_at_load(raw):
    with pytest.raises(ValueError, match="env_report .* is neither a JSON object nor base64 of one"):
        load_config("tiny", {"env_report": raw})

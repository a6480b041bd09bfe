"""HF export during training and from a checkpoint: loadable snapshots, MLflow registry versions,
the champion alias, and the export flow cached across runs."""

from __future__ import annotations

import pytest
import torch
from mlflow.tracking import MlflowClient

import flows  # noqa: F401
from miles_core.checkpoint import is_complete_export
from flows.recipes import load_config


@pytest.mark.usefixtures("prefect_harness")
def test_export_register_champion_and_cached_export_flow(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flows.export import export
    from flows.train import train

    cfg = load_config("tiny", {
        "run_dir": str(tmp_path / "run"), "num_rollout": 4, "rollout_batch_size": 4, "eval_interval": 2, "export_interval": 2,
        "registered_model_name": "tiny-grpo", "champion_metric": "eval/arith", "save_interval": 2,
    })
    summary = train(cfg)
    snaps = sorted(p.name for p in cfg.export_dir.iterdir())
    assert snaps == ["1", "3"] and all(is_complete_export(cfg.export_dir / s) for s in snaps)

    model = AutoModelForCausalLM.from_pretrained(cfg.export_dir / "3")
    tok = AutoTokenizer.from_pretrained(cfg.export_dir / "3")
    out = model.generate(torch.tensor([tok("2+3=")["input_ids"]]), max_new_tokens=6, do_sample=False)
    assert out.shape[1] > 4

    client = MlflowClient(cfg.tracking_uri)
    versions = sorted(client.search_model_versions("name='tiny-grpo'"), key=lambda v: int(v.version))
    assert [v.tags["rollout_id"] for v in versions] == ["1", "3"]
    assert all(v.run_id == summary["mlflow_run_id"] for v in versions)
    evals = {m.step: m.value for m in client.get_metric_history(summary["mlflow_run_id"], "eval/arith")}
    values = [float(v.tags["miles.champion_metric_value"]) for v in versions]
    assert values == [evals[3], evals[5]]  # the eval after rollouts 1 and 3 (weight versions 3 and 5)
    champion = client.get_model_version_by_alias("tiny-grpo", "champion")
    want = "2" if values[1] > values[0] else "1"
    assert str(champion.version) == want

    # the standalone export flow: a save dir's latest checkpoint -> HF snapshot, cached on a rerun
    first = export(str(cfg.save_dir), str(tmp_path / "exp"))
    marker = tmp_path / "exp" / "3" / ".complete"
    stamp = marker.stat().st_mtime_ns
    second = export(str(cfg.save_dir), str(tmp_path / "exp"))
    assert first == second and marker.stat().st_mtime_ns == stamp  # not redone
    a = AutoModelForCausalLM.from_pretrained(tmp_path / "exp" / "3")
    ids = torch.tensor([tok("7+1=")["input_ids"]])
    assert torch.equal(a(ids).logits, model(ids).logits)  # checkpoint export == live export of rollout 3


@pytest.mark.usefixtures("prefect_harness")
def test_champion_is_judged_by_the_eval_of_the_exported_weights(tmp_path, tiny_model_dir):
    """Exports after rollouts 0 and 1 (weight versions 2 and 3), evals before training and after rollout 1 (eval/step 1
    and 3): version 1 has no eval of its own weights (pending, never crowned with the pre-training eval), version 2 is
    crowned with the eval at eval/step 3 and tagged with the metric, the value and the step; version 1 is judged when the
    eval flow evaluates its checkpoint (eval/step 2) later."""
    from flows.train import train

    cfg = load_config("tiny", {
        "run_dir": str(tmp_path / "run"), "num_rollout": 2, "rollout_batch_size": 2, "eval_interval": 2, "export_interval": 1,
        "eval_prompt_data": ["arith", "builtin://arith-test@[0:8]"], "registered_model_name": "judged", "champion_metric": "eval/arith",
        "save_interval": 1,
    })
    summary = train(cfg)
    client = MlflowClient(cfg.tracking_uri)
    evals = {m.step: m.value for m in client.get_metric_history(summary["mlflow_run_id"], "eval/arith")}
    assert sorted(evals) == [1, 3]
    first, second = sorted(client.search_model_versions("name='judged'"), key=lambda v: int(v.version))
    assert "miles.champion_metric_value" not in first.tags and "eval/step 2" in first.tags["miles.champion_pending"]
    assert second.tags["miles.champion_eval_step"] == "3" and second.tags["miles.champion_metric"] == "eval/arith"
    assert float(second.tags["miles.champion_metric_value"]) == evals[3]
    assert client.get_model_version_by_alias("judged", "champion").version == second.version

    # the eval flow evaluates checkpoint 0 (eval/step 2) later: version 1 is judged by it then
    from flows.evaluate import evaluate

    evaluate(str(cfg.save_dir), "all")
    at2 = {m.step: m.value for m in client.get_metric_history(summary["mlflow_run_id"], "eval/arith")}[2]
    first = client.get_model_version("judged", first.version)
    assert "miles.champion_pending" not in first.tags and float(first.tags["miles.champion_metric_value"]) == at2
    want = first.version if at2 > evals[3] else second.version
    assert client.get_model_version_by_alias("judged", "champion").version == want

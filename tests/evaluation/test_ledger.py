"""The eval flow's MLflow side: the training config read back from a run's params; the linked run
used when the training run is gone, found again by its tag; a skip logged once per step."""

from __future__ import annotations

from flows.recipes import load_config
from miles_core.assemble import build_config
from miles_core.evaluation import PointResult
from miles_core.evaluation.discover import RunRef
from miles_core.evaluation.ledger import EvalLedger, config_values_from_params
from miles_core.tracking import flatten, sanitize_key
from miles_core.tracking.mlflow_tracker import param_str


def _params(cfg) -> dict[str, str]:  # what the train flow logs (flows/tracking.py: config_params)
    flat = flatten({**cfg.model_dump(mode="json"), "derived": {"global_batch_size": 64}})
    return {sanitize_key(k): param_str(v) for k, v in flat.items()}


def test_config_from_params_roundtrip():
    for recipe, over in [("tiny", {}), ("glm4-5", {}), ("tiny", {"mlflow_run_name": "1234", "eval_config": "e.yaml", "label_key": None}),
                         ("tiny", {"apply_chat_template_kwargs": {"enable_thinking": False, "nested": {"a": 1}}})]:
        cfg = load_config(recipe, over)
        assert build_config(config_values_from_params(_params(cfg))) == cfg


def test_linked_run_when_the_training_run_is_gone(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ref = RunRef("0123456789abcdef", uri, tmp_path, {})  # a run id the store does not have
    first = EvalLedger(ref)
    assert first.linked and first.training_params == {}
    skip = PointResult.skip(5, "ckpt_missing", "no .complete")
    assert first.record(skip) and not first.record(skip)  # once per (reason, step)
    ok = PointResult(6, {"eval/arith": 0.5}, [{"prompt": "1+1=", "response": "2"}])
    assert first.record(ok, lag_steps=1) and not first.record(ok)
    again = EvalLedger(ref)
    assert again.run_id == first.run_id and again.done_steps() == {6}
    run = again.client.get_run(again.run_id)
    assert run.data.tags["miles.eval_of"] == "0123456789abcdef" and run.data.metrics["eval/lag_steps"] == 1.0

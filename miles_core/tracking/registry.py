"""Exported HF snapshots in MLflow: artifacts tied to their step, a registered model version, and
the ``champion`` alias moved when the named eval metric improves (higher is better).

The champion is judged by the eval of the exported weights themselves: the metric's value at the
export's eval/step (the weight version those weights were synced as), never the newest value of the
run (which may belong to older weights). The version is tagged with the metric, the value and the eval
step; when that eval has not run yet (a later eval point, the nightly eval flow), the version is tagged
``miles.champion_pending`` and judged by ``crown_pending`` when that eval lands.

``crown=False`` (a manual promotion gate, flows/promotion.py) judges the same way but leaves the alias:
a version that beats the champion is a candidate, crowned by ``set_champion`` once approved."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .mlflow_tracker import mlflow_client

CHAMPION = "champion"
VALUE_TAG = "miles.champion_metric_value"
METRIC_TAG = "miles.champion_metric"
EVAL_STEP_TAG = "miles.champion_eval_step"
PENDING_TAG = "miles.champion_pending"


@dataclass(frozen=True)
class RegisteredExport:
    version: str | None
    artifact_uri: str
    champion: bool  # the alias moved to this version
    candidate: bool = False  # its metric beats the champion's (crown=False: the alias waits for set_champion)
    pending: bool = False  # its eval has not landed yet: judged by crown_pending


def log_export(tracking_uri: str, run_id: str, export_path: Path, rollout_id: int, step: int,
               model_name: str | None, champion_metric: str | None, eval_step: int | None = None,
               crown: bool = True) -> RegisteredExport:
    """Log ``export_path`` as artifacts of the run, register it under ``model_name``, and crown it (when ``crown``)
    if the champion metric at ``eval_step`` (the exported weights' eval/step) beats the current champion's."""
    from mlflow.exceptions import MlflowException

    client = mlflow_client(tracking_uri)
    artifact_path = f"export/{rollout_id:05d}"
    client.log_artifacts(run_id, str(export_path), artifact_path=artifact_path)
    client.set_tag(run_id, f"miles.export.{rollout_id:05d}", f"rollout_id={rollout_id} train_step={step}")
    uri = f"{client.get_run(run_id).info.artifact_uri}/{artifact_path}"
    if not model_name:
        return RegisteredExport(None, uri, False)
    try:
        client.get_registered_model(model_name)
    except MlflowException:
        client.create_registered_model(model_name)
    tags = {"rollout_id": str(rollout_id), "train_step": str(step), **adapter_tags(Path(export_path), uri)}
    value = _value_at(client, run_id, champion_metric, eval_step) if champion_metric and eval_step is not None else None
    if champion_metric:
        tags |= {METRIC_TAG: champion_metric, EVAL_STEP_TAG: str(eval_step)}
        tags |= {VALUE_TAG: repr(value)} if value is not None else {PENDING_TAG: f"no {champion_metric} at eval/step {eval_step} yet"}
    mv = client.create_model_version(model_name, source=uri, run_id=run_id, tags=tags)
    candidate = value is not None and value > _champion_value(client, model_name)
    if candidate and crown:
        client.set_registered_model_alias(model_name, CHAMPION, mv.version)
    return RegisteredExport(mv.version, uri, candidate and crown, candidate, bool(champion_metric) and value is None)


def adapter_tags(export_path: Path, uri: str) -> dict[str, str]:
    """A LoRA export (an ``adapter/`` PEFT dir, training/lora.py): the version's tags name the adapter's artifacts and
    the base model it applies to (adapter_config.json's base_model_name_or_path, the run's hf_checkpoint)."""
    import json

    config = export_path / "adapter" / "adapter_config.json"
    if not config.is_file():
        return {}
    saved = json.loads(config.read_text())
    return {"lora.adapter": f"{uri}/adapter", "lora.base_model": str(saved.get("base_model_name_or_path")),
            "lora.rank": str(saved.get("r"))}


def crown_pending(tracking_uri: str, run_id: str, model_name: str, metric: str, eval_step: int, value: float,
                  crown: bool = True) -> list[str]:
    """An eval at ``eval_step`` landed with ``metric`` = ``value``: judge the run's versions of ``model_name`` that waited
    for it (tag the value, drop the pending tag, crown when better and ``crown``). -> the versions that beat the
    champion: crowned, or (crown=False) candidates for a promotion gate; versions of the same weights share a value, so
    only the first of them beats it."""
    from mlflow.exceptions import MlflowException

    client = mlflow_client(tracking_uri)
    try:
        versions = client.search_model_versions(f"name='{model_name}' and run_id='{run_id}'")
    except MlflowException:
        return []
    best, beat = _champion_value(client, model_name), []
    for mv in sorted(versions, key=lambda v: int(v.version)):
        tags = mv.tags
        if PENDING_TAG in tags and tags.get(METRIC_TAG) == metric and tags.get(EVAL_STEP_TAG) == str(eval_step):
            client.set_model_version_tag(model_name, mv.version, VALUE_TAG, repr(value))
            client.delete_model_version_tag(model_name, mv.version, PENDING_TAG)
            if value > best:
                best = value
                beat.append(str(mv.version))
                if crown:
                    client.set_registered_model_alias(model_name, CHAMPION, mv.version)
    return beat


def _value_at(client, run_id: str, key: str, eval_step: int) -> float | None:
    """The value of ``key`` logged at eval/step ``eval_step`` (the last one logged there), or None."""
    from miles_core.tracking.keys import sanitize_key

    history = [m for m in client.get_metric_history(run_id, sanitize_key(key)) if m.step == eval_step]
    return max(history, key=lambda m: m.timestamp).value if history else None


def _champion_value(client, name: str) -> float:
    """The current champion's metric value (-inf when there is no champion yet)."""
    from mlflow.exceptions import MlflowException

    try:
        current = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return float("-inf")
    return float(current.tags.get(VALUE_TAG, "-inf"))


def set_champion(tracking_uri: str, name: str, version: str) -> None:
    """Move the champion alias to ``version`` (a manual promotion gate's approval)."""
    mlflow_client(tracking_uri).set_registered_model_alias(name, CHAMPION, version)

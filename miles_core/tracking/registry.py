"""Exported HF snapshots in MLflow: artifacts tied to their step, a registered model version, and
the ``champion`` alias moved when the named eval metric improves (higher is better).

The champion is judged by the eval of the exported weights themselves: the metric's value at the
export's eval/step (the weight version those weights were synced as), never the newest value of the
run (which may belong to older weights). The version is tagged with the metric, the value and the eval
step; when that eval has not run yet (a later eval point, the nightly eval flow), the version is tagged
``miles.champion_pending`` and judged by ``crown_pending`` when that eval lands."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CHAMPION = "champion"
VALUE_TAG = "miles.champion_metric_value"
METRIC_TAG = "miles.champion_metric"
EVAL_STEP_TAG = "miles.champion_eval_step"
PENDING_TAG = "miles.champion_pending"


@dataclass(frozen=True)
class RegisteredExport:
    version: str | None
    artifact_uri: str
    champion: bool


def log_export(tracking_uri: str, run_id: str, export_path: Path, rollout_id: int, step: int,
               model_name: str | None, champion_metric: str | None, eval_step: int | None = None) -> RegisteredExport:
    """Log ``export_path`` as artifacts of the run, register it under ``model_name``, and crown it when the
    champion metric at ``eval_step`` (the exported weights' eval/step) beats the current champion's."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
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
    tags = {"rollout_id": str(rollout_id), "train_step": str(step)}
    value = _value_at(client, run_id, champion_metric, eval_step) if champion_metric and eval_step is not None else None
    if champion_metric:
        tags |= {METRIC_TAG: champion_metric, EVAL_STEP_TAG: str(eval_step)}
        tags |= {VALUE_TAG: repr(value)} if value is not None else {PENDING_TAG: f"no {champion_metric} at eval/step {eval_step} yet"}
    mv = client.create_model_version(model_name, source=uri, run_id=run_id, tags=tags)
    return RegisteredExport(mv.version, uri, _maybe_crown(client, model_name, mv.version, value))


def crown_pending(tracking_uri: str, run_id: str, model_name: str, metric: str, eval_step: int, value: float) -> list[str]:
    """An eval at ``eval_step`` landed with ``metric`` = ``value``: judge the run's versions of ``model_name`` that waited
    for it (tag the value, drop the pending tag, crown when better). -> the versions judged."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    try:
        versions = client.search_model_versions(f"name='{model_name}' and run_id='{run_id}'")
    except MlflowException:
        return []
    judged = []
    for mv in sorted(versions, key=lambda v: int(v.version)):
        tags = mv.tags
        if PENDING_TAG in tags and tags.get(METRIC_TAG) == metric and tags.get(EVAL_STEP_TAG) == str(eval_step):
            client.set_model_version_tag(model_name, mv.version, VALUE_TAG, repr(value))
            client.delete_model_version_tag(model_name, mv.version, PENDING_TAG)
            _maybe_crown(client, model_name, mv.version, value)
            judged.append(str(mv.version))
    return judged


def _value_at(client, run_id: str, key: str, eval_step: int) -> float | None:
    """The value of ``key`` logged at eval/step ``eval_step`` (the last one logged there), or None."""
    from miles_core.tracking.keys import sanitize_key

    history = [m for m in client.get_metric_history(run_id, sanitize_key(key)) if m.step == eval_step]
    return max(history, key=lambda m: m.timestamp).value if history else None


def _maybe_crown(client, name: str, version: str, value: float | None) -> bool:
    """Move the champion alias to ``version`` when its metric beats the current champion's."""
    from mlflow.exceptions import MlflowException

    if value is None:
        return False
    try:
        current = client.get_model_version_by_alias(name, CHAMPION)
        best = float(current.tags.get(VALUE_TAG, "-inf"))
    except MlflowException:
        best = float("-inf")
    if value > best:
        client.set_registered_model_alias(name, CHAMPION, version)
        return True
    return False

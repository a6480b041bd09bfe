"""Exported HF snapshots in MLflow: artifacts tied to their step, a registered model version, and
the ``champion`` alias moved when the named eval metric improves (higher is better)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CHAMPION = "champion"
VALUE_TAG = "miles.champion_metric_value"


@dataclass(frozen=True)
class RegisteredExport:
    version: str | None
    artifact_uri: str
    champion: bool  # the alias moved to this version
    candidate: bool = False  # its metric beats the champion's (with crown=False the alias waits: set_champion)


def log_export(tracking_uri: str, run_id: str, export_path: Path, rollout_id: int, step: int,
               model_name: str | None, champion_metric: str | None, crown: bool = True) -> RegisteredExport:
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
    value = _latest_value(client, run_id, champion_metric) if champion_metric else None
    if value is not None:
        tags[VALUE_TAG] = repr(value)
    mv = client.create_model_version(model_name, source=uri, run_id=run_id, tags=tags)
    candidate = _beats_champion(client, model_name, value)
    if candidate and crown:
        client.set_registered_model_alias(model_name, CHAMPION, mv.version)
    return RegisteredExport(mv.version, uri, candidate and crown, candidate)


def _latest_value(client, run_id: str, key: str) -> float | None:
    from miles_core.tracking.keys import sanitize_key

    history = client.get_metric_history(run_id, sanitize_key(key))
    return max(history, key=lambda m: (m.step, m.timestamp)).value if history else None


def _beats_champion(client, name: str, value: float | None) -> bool:
    """Whether ``value`` beats the current champion's metric (no champion yet: any value does)."""
    from mlflow.exceptions import MlflowException

    if value is None:
        return False
    try:
        current = client.get_model_version_by_alias(name, CHAMPION)
        best = float(current.tags.get(VALUE_TAG, "-inf"))
    except MlflowException:
        best = float("-inf")
    return value > best


def set_champion(tracking_uri: str, name: str, version: str) -> None:
    """Move the champion alias to ``version`` (a manual promotion gate's approval)."""
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri).set_registered_model_alias(name, CHAMPION, version)

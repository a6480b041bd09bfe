"""The Prefect flow run and the MLflow run point at each other.

The MLflow run is named ``<recipe> · <flow-run name>`` (unless mlflow_run_name says otherwise) and
tagged with the flow run's id, name, UI URL (when the Prefect API has a UI: ``miles serve``), the
deployment, and the project's git commit (``mlflow.source.git.commit``, which MLflow's UI shows); the
experiment is tagged of kind model training, and the links carry ``workflowType=machine_learning``, so
MLflow's UI opens them on runs and charts. The MLflow run URL
(for the Prefect summary) is known when the store is an MLflow server, or ``mlflow_ui_url`` names one.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from miles_core.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")  # the experiment page's kind selector: "Machine learning"
# MLflow 3.17's UI does not choose the view by that tag: its workflow switch (always on) takes the page's
# ``workflowType`` query parameter, else the browser's saved choice, else "genai" (Traces first). Every MLflow
# page miles links carries the model-training view (tests/tracking/test_mlflow_view.py reads the UI bundle).
ML_VIEW = "?workflowType=machine_learning"


@dataclass(frozen=True)
class FlowRun:
    id: str
    name: str
    ui_url: str | None
    deployment: str | None


def current_flow_run() -> FlowRun | None:
    from prefect.runtime import deployment, flow_run

    if not flow_run.id:
        return None
    return FlowRun(id=str(flow_run.id), name=flow_run.name, ui_url=flow_run.ui_url, deployment=deployment.name)


def run_name(cfg: TrainConfig) -> str:
    if cfg.tracking.mlflow_run_name:
        return cfg.tracking.mlflow_run_name
    fr = current_flow_run()
    return f"{cfg.misc.recipe} · {fr.name}" if fr else cfg.misc.recipe


SOURCE_NAME = "flows/train.py"  # the train flow's entry point (deployments/prefect.yaml), the run's source in MLflow


def git_commit(root: Path = ROOT) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def link_tags(fr: FlowRun | None, commit: str | None) -> dict[str, str]:
    # MLflow's UI shows the commit as the run's source version only beside a source name and type
    tags = {"mlflow.source.name": SOURCE_NAME, "mlflow.source.type": "JOB"}
    tags |= {"mlflow.source.git.commit": commit} if commit else {}
    if fr:
        tags |= {"prefect.flow_run_id": fr.id, "prefect.flow_run_name": fr.name}
        tags |= {"prefect.flow_run_url": fr.ui_url} if fr.ui_url else {}
        tags |= {"prefect.deployment": fr.deployment} if fr.deployment else {}
    return tags


def tag_run(tracker) -> dict[str, str]:
    """Tag the MLflow run with the current flow run and commit; mark the experiment as model training."""
    tags = link_tags(current_flow_run(), git_commit())
    tracker.set_tags(tags)
    exp = tracker.client.get_experiment(tracker.experiment_id)
    if EXPERIMENT_KIND[0] not in exp.tags:
        tracker.client.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND)
    return tags


def mlflow_run_url(cfg: TrainConfig, experiment_id: str, run_id: str) -> str | None:
    """The run's page in the MLflow UI, when one is known (an http(s) tracking URI, or mlflow_ui_url)."""
    base = cfg.tracking.mlflow_ui_url or (cfg.tracking_uri if cfg.tracking_uri.startswith(("http://", "https://")) else None)
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}{ML_VIEW}" if base else None


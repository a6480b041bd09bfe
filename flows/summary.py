"""The train flow's Prefect summary artifact (``train-summary``): the MLflow run (a clickable link
when an MLflow UI URL is known), the reward, the best eval per dataset, the exports and the champion,
the other trackers, and the plots inline (PNG data URIs, which Prefect's markdown artifacts render)."""

from __future__ import annotations

from miles_core.config import TrainConfig
from miles_core.tracking.fanout import RunTracker
from miles_core.tracking.report import data_uri, read_run

from .links import mlflow_run_url

TRACKER_TAGS = {"miles.wandb": "W&B", "miles.tensorboard": "TensorBoard", "miles.prometheus": "Prometheus"}


def summary_markdown(config: TrainConfig, tracker: RunTracker, summary: dict) -> str:
    """Markdown of the finished run ``summary`` (the flow's return value)."""
    run_id = tracker.mlflow.run_id
    facts = read_run(config.tracking_uri, run_id)
    url = mlflow_run_url(config, facts.experiment_id, run_id)
    run = f"[{run_id}]({url})" if url else f"`{run_id}` (`mlflow ui --backend-store-uri {config.tracking_uri}`)"
    lines = [f"# miles train {config.misc.recipe}", "", f"- **MLflow run**: {run} — {facts.run_name}",
             f"- **MLflow store**: `{config.tracking_uri}`, experiment {facts.experiment_id}"]
    lines += [f"- **{k}**: {v}" for k, v in summary.items() if k not in ("mlflow_run_id", "tracking_uri", "experiment_id")]
    best = facts.best_evals()
    lines += ["", "## Best eval", ""] + ([f"- {ds}: **{v:.4g}** at eval/step {s}" for ds, (s, v) in best.items()] or ["- no eval logged"])
    lines += ["", "## Exports", ""] + ([f"- {x.detail}: `{x.artifact_uri}`" for x in facts.exports] or ["- none"])
    lines += [f"- champion: {facts.champion}" if facts.champion else "- champion: none"]
    trackers = [f"- {name}: {facts.tags[tag]}" for tag, name in TRACKER_TAGS.items() if tag in facts.tags]
    lines += (["", "## Trackers", ""] + trackers) if trackers else []
    lines += ["", "## Curves", ""] + [f"![{p.stem}]({data_uri(p)})" for p in tracker.plots]
    return "\n".join(lines)

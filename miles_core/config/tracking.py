"""Tracking arguments (REFERENCE §7)."""

from __future__ import annotations

from pydantic import Field

from ._base import Group


class TrackingConfig(Group):
    mlflow_tracking_uri: str | None = Field(None, description="MLflow tracking URI (default sqlite:///<run_dir>/mlflow.db).")
    mlflow_experiment_name: str = Field("miles", description="MLflow experiment.")
    mlflow_run_name: str | None = Field(None, description="MLflow run name (default the recipe name).")
    mlflow_new_run: bool = Field(False, description="On resume, log into a new MLflow run instead of re-attaching to the checkpoint's run (needed when params changed).")
    log_samples: int = Field(8, ge=0, description="Sample completions logged per rollout as a table.")
    log_multi_turn: bool = Field(
        False, description="custom_generate_function_path: the sample table shows whole conversations (turn markers, tool "
        "messages) with their round number, tool calls and tool failure.")
    log_samples_interval: int | None = Field(
        None, ge=1, description="Log the sample table after rollout i when (i+1) % interval == 0 or i is the last (default: eval_interval, else 1).")

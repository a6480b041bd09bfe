"""Run identity and everything else."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ._base import Group


class MiscConfig(Group):
    recipe: str = Field("custom", description="Recipe name (set by the recipe file).")
    run_dir: str | None = Field(None, description="Run directory for rollouts, the local MLflow store and defaults of save/export (default runs/<recipe>).")
    seed: int = Field(1234, description="Seed of model init, training and sampling.")
    dtype: Literal["float32", "bfloat16", "float16", "float64"] = Field(
        "float32", description="Training and rollout dtype on the local runtime (a torch floating dtype name).")

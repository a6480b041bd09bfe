"""Prompt data arguments (REFERENCE §2, Data)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ._base import Group

# data_source_path: the reference's own data sources (miles/rollout/data_source.py) -> read-only (no add_samples); both are
# miles' data source here (rollout/custom_rollout.py)
REFERENCE_DATA_SOURCES = {"miles.rollout.data_source.RolloutDataSourceWithBuffer": False,
                          "miles.rollout.data_source.RolloutDataSource": True}


class DataConfig(Group):
    """The prompt dataset: its file, row keys, chat template, shuffling and epochs."""

    prompt_data: str | None = Field(None, description="Prompt dataset: a jsonl or parquet path, optionally sliced as path@[start:end]; builtin://<name> for a generated task.")
    disable_rollout_global_dataset: bool = Field(
        False, description="No prompt dataset: prompt_data is not loaded (and must not be set), data_source.get_samples hands out "
                           "groups of empty Samples (numbered on), and a rollout_function_path function makes the prompts; "
                           "num_rollout is then required.")
    data_source_path: str = Field(
        "miles.rollout.data_source.RolloutDataSourceWithBuffer",
        description="The data source a rollout_function_path function gets: the reference's RolloutDataSourceWithBuffer "
                    "(default) or RolloutDataSource (no add_samples) are miles' own over prompt_data (its state saved in every "
                    "checkpoint); another dotted path names a class built with (args) that has get_samples(n), add_samples, "
                    "save(rollout_id) and load(rollout_id), called at each checkpoint save and resume.")
    input_key: str = Field("input", description="Row key of the prompt.")
    label_key: str | None = Field("label", description="Row key of the label (None: no label).")
    metadata_key: str = Field("metadata", description="Row key of the per-sample metadata dict.")
    tool_key: str | None = Field(None, description="Row key of tool definitions passed to the chat template.")
    apply_chat_template: bool = Field(False, description="Render prompts with the tokenizer's chat template.")
    chat_template_path: str | None = Field(
        None, description="A Jinja chat template file used instead of the tokenizer's own, for the prompts, the eval prompts "
                          "and the multi-turn loop's tool messages (the reference's load_tokenizer).")
    apply_chat_template_kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for apply_chat_template.")
    rollout_shuffle: bool = Field(False, description="Shuffle prompts, reshuffled per epoch with rollout_seed + epoch.")
    rollout_seed: int = Field(42, description="Seed of the prompt shuffle and of rollout sampling.")
    num_epoch: int = Field(1, ge=1, description="Passes over the dataset when num_rollout is not given.")
    start_rollout_id: int | None = Field(
        None, ge=0, description="Resume at this rollout instead of after the latest checkpoint, as the reference's override: "
                                "the latest checkpoint's weights and optimizer, the data state (prompt cursor) saved by the "
                                "checkpoint of rollout start_rollout_id - 1 (fresh at 0). Needs a checkpoint in load; a new "
                                "MLflow run (mlflow_new_run: the params changed); async_mode off.")
    debug_exit_after_rollout: int | None = Field(
        None, ge=1, description="Stop the run after this many rollouts of this invocation (counted from the rollout it "
                                "starts or resumes at), after that rollout's save, sync and eval; num_rollout and every "
                                "schedule keep their values, so a resume continues as if never stopped (no extra save).")

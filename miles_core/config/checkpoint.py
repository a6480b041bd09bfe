"""Model loading, checkpoint and export arguments (REFERENCE §6)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ._base import Group


class CheckpointConfig(Group):
    """The model to start from, checkpoint save and load, HF exports and the MLflow model registry."""

    hf_checkpoint: str = Field("builtin://tiny-qwen2", description="Initial model: an HF directory, a hub id, or builtin://<name> built offline.")
    model_name: str | None = Field(
        None, description="train_backend megatron: the reference's converter name (its Megatron-to-HF tensor mapping): "
                          "qwen2, qwen3, llama, qwen3_moe, glm4_moe, glm4_moe_lite, deepseekv3 or a name containing one "
                          "(Qwen2ForCausalLM); it must be the converter of config.json's model_type (qwen2 and qwen3 share "
                          "one), whose HF model the weights load into: another one is refused naming both. Default: that "
                          "model_type's.")
    ref_load: str | None = Field(None, description="Reference model for KL terms (default hf_checkpoint).")
    load: str | None = Field(None, description="Checkpoint dir to resume from (default: save); missing -> fresh start from hf_checkpoint.")
    save: str | None = Field(None, description="Checkpoint dir (default <run_dir>/checkpoints).")
    save_interval: int | None = Field(None, ge=1, description="Save after rollout i when (i+1) % save_interval == 0; always after the last.")
    save_trigger_sentinel: str | None = Field(
        None, description="Path of a file that requests a checkpoint from outside the run: if it exists after a rollout's "
                          "train step, that rollout is saved (as if save_interval were due) and the file is removed. With "
                          "async_mode and update_weights_interval > 1 it is looked at only after rollouts that sync weights.")
    async_save: bool = Field(
        False, description="train_backend torch: a save snapshots the checkpoint (weights, optimizer, RNG, state) into host "
        "memory and a background thread writes it (still atomically: temp dir, manifest, rename, latest pointer last) "
        "while training goes on; the run waits for it before the next save, at the end and before it exits (the "
        "reference's Megatron-LM async save). Refused with train_backend megatron.")
    keep_last: int | None = Field(None, ge=1, description="Keep only the newest N checkpoints.")
    keep_rollouts: int = Field(
        4, ge=1, description="Rollout files (<run_dir>/rollouts/<id>.pt) kept besides those a resume can still need (after "
        "the latest complete checkpoint); older ones are deleted after each save. Their samples live on in the MLflow "
        "sample tables (log_samples).")
    no_save_optim: bool = Field(False, description="Do not save optimizer state.")
    export: str | None = Field(None, description="HF export dir (default <run_dir>/export).")
    export_interval: int | None = Field(None, ge=1, description="Export an HF snapshot every N rollouts (and after the last).")
    registered_model_name: str | None = Field(None, description="MLflow registered model name for exports.")
    champion_metric: str | None = Field(None, description="Eval metric whose improvement moves the 'champion' alias.")
    promotion_gate: Literal["auto", "manual"] = Field(
        "auto", description="auto: the champion alias moves as soon as an export's champion_metric (the eval of its own weights) "
                            "beats the champion's; manual: the flow pauses first (Prefect pause_flow_run with an approve/reject form "
                            "showing the eval table) and moves it only when approved (needs export_interval, registered_model_name "
                            "and champion_metric).")
    promotion_timeout: int = Field(3600, ge=1, description="Seconds a manual promotion gate waits for an answer; then the alias stays and the run goes on.")

"""Run identity and everything else."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, field_validator

from ._base import Group


# The pipeline's Prefect task names (tasks/*.py; tests/test_flows_unit.py keeps the two lists equal).
TASK_NAMES = ("convert", "prepare", "restore", "generate", "train", "update-weights", "save", "eval", "export", "export-checkpoint",
              "register", "sample-rows", "eval-prepare", "eval-point", "snapshot-eval-submit", "snapshot-eval-collect")


class MiscConfig(Group):
    """The run's identity (recipe, run dir, seed), its dtype, debug switches and task timeouts."""

    form_first = ("run_dir", "seed")

    recipe: str = Field("custom", description="Recipe name (set by the recipe file).")
    run_dir: str | None = Field(None, description="Run directory for rollouts, the local MLflow store and defaults of save/export (default runs/<recipe>).")
    seed: int = Field(1234, description="Seed of model init, training and sampling.")
    dtype: Literal["float32", "bfloat16", "float16", "float64"] = Field(
        "float32", description="Model dtype (a torch floating dtype name): rollout engines, weight sync and exports; "
                               "with bfloat16 / float16 the trainers keep fp32 main weights and fp32 gradients "
                               "(docs/guide/backends.md, mixed precision).")
    # ---- debugging (the reference's train group)
    debug_skip_weight_update: bool = Field(
        False, description="Never send the trainer's weights to the engines (also not before rollout 0): they keep generating with "
                           "the weights they loaded, weight_version stays 0 (the reference's --debug-skip-weight-update).")
    debug_disable_optimizer: bool = Field(
        False, description="train_backend torch: compute the losses, gradients and grad norms of every step, but never apply them "
                           "(no AdamW update: the policy and critic stay as loaded; the reference's --debug-disable-optimizer).")
    # ---- the reference's debug group: rollout dumps and one-sided runs (docs/guide/coming-from-the-reference.md)
    save_debug_rollout_data: str | None = Field(
        None, description="Also save each rollout's samples to this path template ({rollout_id}) in the reference's format: "
                          "torch.save of {rollout_id, metadata, samples: [Sample.to_dict()]}, readable by load_debug_rollout_data "
                          "(miles' own <run_dir>/rollouts/<id>.pt is written as always).")
    save_debug_trajectory_data: str | None = Field(
        None, description="With save_debug_rollout_data: one JSONL row per sample that recorded a conversation "
                          "(metadata['messages'], moved out of the .pt) at this path template ({rollout_id}); no file when none did.")
    load_debug_rollout_data: str | None = Field(
        None, description="Train on the rollouts recorded at this path template ({rollout_id}; save_debug_rollout_data's) instead "
                          "of generating: no rollout engine is built, no weight sync and no eval run (debug_train_only). Each "
                          "file must hold rollout_batch_size * n_samples_per_prompt samples (after the subsample).")
    load_debug_rollout_data_subsample: float | None = Field(
        None, gt=0, le=1, description="Keep int(n * this) of each loaded rollout's n samples: the first and the last half of them.")
    save_debug_train_data: str | None = Field(
        None, description="Save each rollout's training data after its optimizer steps to this path template ({rollout_id}, "
                          "{rank}): tokens, loss masks, rewards and the per-token log-probs, values, advantages and returns "
                          "the steps used, in the reference's keys (miles_core/training/train_dump.py).")
    dump_details: str | None = Field(
        None, description="Dump everything under this dir, as the reference: rollout_data/{rollout_id}.pt "
                          "(save_debug_rollout_data), train_data/{rollout_id}_{rank}.pt (save_debug_train_data) and "
                          "trajectory/{rollout_id}.jsonl (save_debug_trajectory_data) and events/ (save_debug_event_data).")
    # ---- the reference's event logger and analyzer (miles_core/runtime/events.py; docs/guide/coming-from-the-reference.md)
    save_debug_event_data: str | None = Field(
        None, description="Write the run's typed events to this dir, one JSON-lines file per process (main.jsonl: rollouts, "
                          "train steps, weight syncs, checkpoints, metrics; actor_cell0_rank0.jsonl: the trainer's checksums), "
                          "as the reference's event logger; snapshotted into each checkpoint (<save>/debug_events/<rollout_id>/) "
                          "and restored from it on resume.")
    save_local_weight_checksum: bool = Field(
        False, description="With save_debug_event_data: at each weight sync the trainer records a sha256 of every tensor it "
                           "sends and each engine one of every tensor it holds after the sync (our engines: in process or "
                           "over HTTP), as events.")
    enable_event_analyzer: bool = Field(
        False, description="Check the event dir before each train step and at the run's end, as the reference: every engine "
                           "holds what the trainer sent and all engines hold the same weights; a mismatch fails the run naming "
                           "the first tensor and the weight version.")
    env_report: str = Field(
        default_factory=lambda: os.environ.get("MILES_SCRIPT_ENV_REPORT", ""),
        description="The launcher's environment report, JSON (or base64 of JSON; default: $MILES_SCRIPT_ENV_REPORT). Set, "
                    "the run collects its pip packages and the git state of each editable one (the reference's node "
                    "report), prints it as ENV_REPORT_JSON=..., logs it to MLflow (env_report/ artifact, "
                    "launcher_env_report.* params) and the launcher's report into the W&B config.")
    # ---- the reference's tensor dumper (SGLang's dumper layout; docs/guide/debugging.md, tensor dumps)
    dumper_enable: bool = Field(
        False, description="Dump tensors in SGLang's dumper layout (sglang.srt.debug_utils.dumper) in all three phases: the "
                           "engines' forward passes (inference), the trainer's forward-only passes (fwd_only: old, ref, teacher "
                           "log-probs, critic values) and its training forward + backward (fwd_bwd); dumper_inference / "
                           "dumper_fwd_only / dumper_fwd_bwd can turn a phase off (enable=false) or on without it.")
    dumper_dir: str = Field(
        "/tmp/dumper", description="The dumps' base dir: engines/engine_<i>/, fwd_only/[ref_|teacher_|critic_]rollout_<id>/, "
                                   "fwd_bwd/[critic_]rollout_<id>/. The default (the reference's /tmp/dumper) means "
                                   "<run_dir>/dumper here, so nothing is written outside the run dir; another value is used "
                                   "as given (relative to the working dir).")
    dumper_inference: list[str] | None = Field(
        None, description="The inference phase's dumper options as key=value pairs of SGLang's DumperConfig (e.g. "
                          "['non_intrusive_mode=all', 'filter=layer_id is None or layer_id < 3']), sent to every engine "
                          "(/dumper/configure) before each rollout's generation.")
    dumper_fwd_only: list[str] | None = Field(
        None, description="The trainer's forward-only phase's dumper options (key=value pairs of DumperConfig).")
    dumper_fwd_bwd: list[str] | None = Field(
        None, description="The trainer's forward + backward phase's dumper options (key=value pairs of DumperConfig; "
                          "enable_grad dumps each dumped activation's gradient, enable_model_value / enable_model_grad each "
                          "parameter and its gradient after the backward).")
    dumper_source_patcher_config_inference: str | None = Field(
        None, description="rollout_engine sglang: a YAML file of SGLang's source patcher (functions edited to call "
                          "dumper.dump), given to every SGLang server (DUMPER_SOURCE_PATCHER_CONFIG).")
    dumper_source_patcher_config_train: str | None = Field(
        None, description="With dumper_enable: a YAML file of SGLang's source patcher applied to the trainer's code when it "
                          "is built (functions edited to call dumper.dump, which dumps into the trainer's current phase; "
                          "miles_core/training/source_patch.py).")
    debug_rollout_only: bool = Field(
        False, description="Generate (and score) rollouts only: no train step, no checkpoint, no weight sync (the engines keep "
                           "the weights they loaded, weight_version 0); the trainer is built but never steps.")
    debug_train_only: bool = Field(
        False, description="Train only, without rollout engines: needs load_debug_rollout_data (set by it anyway); no weight "
                           "sync, no eval.")
    ci_inject_rollout_data_path: str | None = Field(
        None, description="CI comparisons: from rollout ci_inject_rollout_data_start_rollout_id on, each rollout is generated "
                          "as usual, checked against the recording at this path template ({rollout_id}) and then replaced "
                          "by it for training (engines stay on, unlike load_debug_rollout_data).")
    ci_inject_rollout_data_start_rollout_id: int | None = Field(
        None, ge=0, description="The first rollout whose training data is the ci_inject_rollout_data_path recording.")
    ci_inject_rollout_data_min_match_ratio: float = Field(
        0.9, ge=0, le=1, description="The generated responses must match the recording's tokens at a mean ratio above this "
                                     "(else the engine's weights diverged from the recorded run's: the rollout fails).")
    check_weight_update_equal: bool = Field(
        False, description="Check the first weight sync of a fresh run: the engines snapshot the weights they loaded "
                           "(hf_checkpoint, the trainer's too) and overwrite them with random values; after the sync every "
                           "parameter must equal its snapshot (SGLang's /weights_checker; the HF engine's own). A resumed "
                           "run's first sync sends checkpoint weights: it is not checked.")
    check_weight_update_selector: Literal["all", "target", "draft"] = Field(
        "all", description="Which engine model the check covers: all and target check the policy (miles' engines have no "
                           "draft / MTP model, so draft is refused).")
    check_weight_update_skip_list: list[str] | None = Field(
        None, description="Parameter-name substrings whose mismatches the check reports without failing.")
    check_weight_update_allow_quant_error: bool = Field(
        False, description="Let quantized tensors differ by 1 ULP of their dtype (passed to SGLang's checker; the HF "
                           "engine's tensors are not quantized, so it compares exactly either way).")
    check_lora_weight_equal: bool = Field(
        False, description="Check every adapter sync (lora_sync_from_tensor, the adapter sent as tensors): the trainer sends "
                           "a sha256 of each adapter tensor (SGLang's expected_checksums) and the engine refuses a load whose "
                           "tensors do not hash to them, a name missing or extra; the sync fails naming them. The LoRA "
                           "counterpart of check_weight_update_equal (docs/guide/lora.md).")
    # ---- profiling (the reference's debug group, with the Megatron-LM flags it reads; miles_core/training/profiler.py)
    use_pytorch_profiler: bool = Field(
        False, description="Trace the profile_target parts of training with torch.profiler (CPU ops, and CUDA kernels on a GPU; "
                           "shapes, stacks, memory, FLOPs) on the steps [profile_step_start, profile_step_end), into "
                           "<tensorboard_dir>/<target>_rank_<rank>.<ns>.pt.trace.json.gz (chrome://tracing, Perfetto, "
                           "TensorBoard), logged to MLflow under profile/ (Megatron-LM's --use-pytorch-profiler).")
    profile_step_start: int = Field(
        10, ge=0, description="The first profiled step: a train_rollout call of this trainer process (train_overall, counted "
                              "from 0), a micro-batch of the pass (train_actor, train_log_probs).")
    profile_step_end: int = Field(12, ge=1, description="The step after the last profiled one (> profile_step_start).")
    profile_target: list[Literal["train_overall", "train_actor", "train_log_probs"]] = Field(
        ["train_overall"], min_length=1, description="What use_pytorch_profiler traces: train_overall (the trainer's life, a "
        "step per rollout trained), train_actor (each optimizer step's micro-batches, a step each), train_log_probs (each "
        "forward-only pass: old policy, reference, ...; a step per micro-batch). train_overall cannot be combined with the other "
        "two (torch.profiler does not nest). record_memory_history needs train_overall in it.")
    record_memory_history: bool = Field(
        False, description="device cuda: record the CUDA caching allocator's history from the trainer's build "
                           "(torch.cuda.memory._record_memory_history) and dump a snapshot after memory_snapshot_num_steps "
                           "rollouts, and at a CUDA out-of-memory error (Megatron-LM's --record-memory-history); "
                           "view it at pytorch.org/memory_viz.")
    memory_snapshot_path: str = Field(
        "snapshot.pickle", description="The memory snapshot file's name, after memory_snapshot_time<t>_rank<r>_ "
                                       "(Megatron-LM's --memory-snapshot-path).")
    memory_snapshot_dir: str = Field(
        ".", description="Where record_memory_history's snapshots go; a relative dir is under the run dir.")
    memory_snapshot_num_steps: int | None = Field(
        None, ge=1, description="Dump the memory snapshot (and stop recording) after training rollout "
                                "memory_snapshot_num_steps - 1; unset: only at an out-of-memory error.")
    memory_recorder: Literal["torch", "memray"] = Field(
        "torch", description="What records record_memory_history: torch (the CUDA allocator's history); memray (the "
                             "reference's host-memory recorder) is not supported yet.")
    # ---- the reference's ci group: the checks its CI runs (docs/guide/debugging.md)
    ci_test: bool = Field(
        False, description="Run the reference's CI checks: the first optimizer step of each rollout is on-policy (|train/ppo_kl| < 1e-9, "
                           "|train/pg_clipfrac| < 1e-10; |train/kl_loss| < 1e-9 at the run's first step: bit-exact, so with "
                           "num_steps_per_rollout > 1 the micro-batches must give both passes the same rows), at rollout 0 rollout/log_probs "
                           "equals rollout/ref_log_probs (1e-8) and every rollout's rollout/log_probs is within 0.03 of "
                           "rollout/rollout_log_probs, the engines report the trainer's weight version after each sync, and the "
                           "check of check_weight_update_equal (unless ci_disable_weight_update_checker or a one-sided run); "
                           "a failed check fails the run.")
    ci_disable_kl_checker: bool = Field(False, description="With ci_test: skip its ppo_kl / pg_clipfrac / kl_loss check.")
    ci_disable_logprobs_checker: bool = Field(False, description="With ci_test: skip its log-prob checks (trainer vs reference, trainer vs engine).")
    ci_disable_weight_update_checker: bool = Field(
        False, description="With ci_test: do not turn on the weight-update check (check_weight_update_equal itself still does).")
    ci_metric_checker_key: str | None = Field(
        None, description="With ci_test: an eval metric (e.g. eval/gsm8k); the run fails at its end unless some eval point reached "
                          "ci_metric_checker_threshold on it.")
    ci_metric_checker_threshold: float | None = Field(None, description="The value ci_metric_checker_key must reach (>=) at some eval point.")
    ci_save_grad_norm: str | None = Field(
        None, description="With ci_test: save each optimizer step's grad norm to this path template ({role} actor|critic, "
                          "{rollout_id}, {step_id}; torch.save of a float), for a rerun with ci_load_grad_norm.")
    ci_load_grad_norm: str | None = Field(
        None, description="With ci_test: compare each optimizer step's grad norm with the one saved at this path template "
                          "(ci_save_grad_norm's); a difference beyond rel/abs 0.03, or a missing file, fails the run.")
    ci_save_model_hash: bool = Field(
        False, description="With ci_test: each checkpoint records a SHA-256 per layer of the trainer's weights (names, shapes, "
                           "dtypes, bytes) in its meta.")
    ci_check_model_hash: bool = Field(
        False, description="With ci_test: after a checkpoint is restored, the trainer's weights must hash to what the checkpoint "
                           "recorded (ci_save_model_hash); a mismatch or a checkpoint without hashes fails the run.")
    task_timeouts: dict[str, float] = Field(
        default_factory=dict, description="Seconds a Prefect task run may take, by task name (e.g. {generate: 600, eval: 900}); a "
        "task past it fails, then its retries, then the flow. Unset tasks keep their defaults (docs/reference/flows.md).")

    @property
    def check_weights(self) -> bool:
        """The weight-update check runs: check_weight_update_equal, or ci_test (not in a run without syncs, not with
        ci_disable_weight_update_checker), as the reference's miles_validate_args sets it."""
        return self.check_weight_update_equal or (self.ci_test and not self.debug_rollout_only and not self.train_only
                                                  and not self.debug_skip_weight_update and not self.ci_disable_weight_update_checker)

    @property
    def rollout_dump(self) -> str | None:
        """The rollout dump's path template: dump_details' rollout_data/, else save_debug_rollout_data."""
        return f"{self.dump_details}/rollout_data/{{rollout_id}}.pt" if self.dump_details else self.save_debug_rollout_data

    @property
    def launcher_env_report(self) -> dict | None:
        """env_report decoded (JSON, or base64 of JSON; None when empty): the launcher's report."""
        from .rules_events import decode_env_report

        return decode_env_report(self.env_report)

    @property
    def event_dir(self) -> str | None:
        """The event dir: dump_details' events/, else save_debug_event_data (the reference's miles_validate_args)."""
        return f"{self.dump_details}/events" if self.dump_details else self.save_debug_event_data

    @property
    def trajectory_dump(self) -> str | None:
        return f"{self.dump_details}/trajectory/{{rollout_id}}.jsonl" if self.dump_details else self.save_debug_trajectory_data

    @property
    def train_dump(self) -> str | None:
        return f"{self.dump_details}/train_data/{{rollout_id}}_{{rank}}.pt" if self.dump_details else self.save_debug_train_data

    @property
    def train_only(self) -> bool:
        """No rollout engines: debug_train_only, or load_debug_rollout_data (which sets it in the reference)."""
        return self.debug_train_only or self.load_debug_rollout_data is not None

    @field_validator("task_timeouts")
    @classmethod
    def _known_tasks(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(v) - set(TASK_NAMES))
        if unknown:
            raise ValueError(f"task_timeouts: unknown task {', '.join(unknown)}; the tasks are {', '.join(TASK_NAMES)}")
        bad = sorted(k for k, s in v.items() if not s > 0)
        if bad:
            raise ValueError(f"task_timeouts: the timeout of {', '.join(bad)} must be > 0 seconds")
        return v

"""Evaluation arguments (REFERENCE §5)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ._base import Group


class EvalConfig(Group):
    """Periodic evaluation: when it runs, its datasets and its sampling settings."""

    eval_interval: int | None = Field(None, ge=1, description="Evaluate after rollout i when (i+1) % eval_interval == 0, and after the last.")
    eval_prompt_data: list[str] | None = Field(None, description="Eval datasets as name path pairs: [name1, path1, name2, path2, ...].")
    eval_config: str | None = Field(None, description="Eval config YAML (defaults + datasets).")
    skip_eval_before_train: bool = Field(False, description="Do not evaluate before the first rollout.")
    n_samples_per_eval_prompt: int = Field(1, ge=1, description="Samples per eval prompt.")
    eval_temperature: float | None = Field(None, gt=0, description="Eval temperature (default rollout_temperature).")
    eval_top_p: float | None = Field(None, gt=0, le=1, description="Eval top-p (default rollout_top_p).")
    eval_top_k: int | None = Field(None, description="Eval top-k (default rollout_top_k).")
    eval_max_response_len: int | None = Field(None, ge=1, description="Eval max new tokens (default rollout_max_response_len).")
    eval_min_new_tokens: int | None = Field(
        None, ge=0, description="Eval min new tokens: EOS and stop token ids are masked until an answer has this many "
        "(SGLang's min_new_tokens sampling param; an eval dataset's min_new_tokens wins; default 0, none).")
    eval_max_prompt_len: int | None = Field(
        None, ge=1, description="Eval prompts longer than this many tokens are dropped (default: rollout_max_prompt_len, else no limit).")
    eval_max_context_len: int | None = Field(
        None, ge=2, description="Eval prompt + response tokens at most: each eval response's budget is min(its max response "
                                "length, this less the prompt's length, at least 1) (default: no cap beyond the max response "
                                "length).")
    eval_input_key: str | None = Field(None, description="Key of the prompt in the eval datasets (default input_key); an eval_config dataset's own input_key (or its defaults') wins.")
    eval_label_key: str | None = Field(None, description="Key of the label in the eval datasets (default label_key); an eval_config dataset's own label_key (or its defaults') wins.")
    eval_tool_key: str | None = Field(
        None, description="Key of the tool definitions in the eval datasets (passed to the chat template; default tool_key); "
                          "an eval_config dataset's own tool_key (or its defaults') wins.")
    eval_function_path: str | None = Field(None, description="Dotted path of a custom eval function (may raise EvalSkip(reason)).")
    eval_mode: Literal["inline", "snapshot"] = Field(
        "inline", description="inline: evaluate the live engine between rollouts (training waits); snapshot: export an HF snapshot "
        "at each eval point and evaluate it on its own engine in the background while training continues.")
    eval_max_in_flight: int = Field(2, ge=1, description="Snapshot evals running at once.")
    eval_overflow_policy: Literal["backpressure", "skip"] = Field("backpressure", description="When eval_max_in_flight is reached: wait, or skip the point.")
    eval_hf_dir: str | None = Field(
        None, description="eval_mode snapshot: the staging directory of the per-eval HF snapshots, <eval_hf_dir>/<weight "
                          "version>/ (e.g. a tmpfs such as /dev/shm/...; default <run_dir>/eval_snapshots), as the reference's "
                          "--eval-hf-dir (its snapshots are step_<rollout id>).")
    eval_keep_snapshots: int | None = Field(None, ge=1, description="Snapshots kept for eval (oldest removed).")

    @property
    def enabled(self) -> bool:
        """Eval datasets are configured: eval_prompt_data pairs or an eval_config file."""
        return bool(self.eval_prompt_data or self.eval_config)

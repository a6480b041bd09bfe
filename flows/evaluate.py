"""The eval flow (``eval``) and the train flow's eval points.

eval(target, which, overrides):
    1. find the points: a checkpoint dir, a save dir (latest, or all), an HF export dir (newest, or all)
    2. find their training run (checkpoint meta / run dir) and open it, or a linked run when it is gone
    3. drop the points the run already has at eval/step (idempotent: a rerun logs nothing twice)
    4. config = the run's params (+ overrides); tokenize its eval datasets
    5. per point: [convert the checkpoint to HF] -> engine -> eval -> log at eval/step, or eval/skipped_<reason>

The train flow calls eval_at(run_key, tracker, config) at each eval point: inline (the eval task on the
live engine) or, with eval_mode snapshot, an exported snapshot evaluated in the background; finished
background evals are logged at the next point and all of them by finish_evals before the run ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.context import get_run_context

from miles_core.config import ConfigError, TrainConfig
from flows.recipes import read_recipe
from miles_core.assemble import build_config
from miles_core.evaluation import PointResult
from miles_core.runtime import registry
from miles_core.evaluation.discover import RunRef, find_points, find_run
from miles_core.evaluation.ledger import EvalLedger, config_values_from_params
from tasks.evaluate import eval_point, prepare_eval, release_eval, snapshot_collect, snapshot_submit
from tasks.timeouts import timed
from tasks.stages import evaluate as evaluate_live

from flows.crashed import mark_crashed
from flows.promotion import judge_pending  # registered versions that wait for an eval, judged behind the promotion gate


@flow(name="eval", validate_parameters=True)
def evaluate(target: str, which: Literal["latest", "all"] = "latest", overrides: dict[str, Any] | None = None) -> dict:
    """Evaluate checkpoints or HF snapshots of a training run, logged into that run at their eval/step.

    Args:
        target: A checkpoint dir, a save dir, an HF export dir (‹export›/‹rollout_id›/...) or one snapshot; or the
            runs dir of a deployment (runs/‹deployment›): every run dir's save dir, each into its own run.
        which: latest = the newest complete one; all = every one the run has not evaluated yet.
        overrides: Config fields over the run's own (eval_prompt_data, eval_config, n_samples_per_eval_prompt,
            mlflow_tracking_uri, recipe when the run's params are gone, ...).
    """
    save_dirs = deployment_save_dirs(Path(target))
    if save_dirs:
        return {"runs": {str(d): _evaluate_one(str(d), which, overrides) for d in save_dirs}}
    return _evaluate_one(target, which, overrides)


def deployment_save_dirs(target: Path) -> list[Path]:
    """The save dirs of the run dirs in ``target`` when it is a deployment's runs dir (not a run dir itself), else []."""
    if not target.is_dir() or (target / "mlflow_run.json").exists():
        return []
    return sorted(m.parent / "checkpoints" for m in target.glob("*/mlflow_run.json") if (m.parent / "checkpoints").is_dir())


def _evaluate_one(target: str, which: str, overrides: dict[str, Any] | None) -> dict:
    overrides = dict(overrides or {})
    points = find_points(Path(target), which)
    if not points:
        raise FileNotFoundError(f"{target}: no complete checkpoint or HF snapshot to evaluate (half-written ones are skipped "
                                "with a warning)")
    ref = find_run(Path(target), points, overrides.get("mlflow_tracking_uri"))
    if ref.run_dir is not None:
        mark_crashed(ref.run_dir)  # a training run killed outright: FAILED as crashed before its eval lands
    ledger = EvalLedger(ref, overrides.get("mlflow_experiment_name", "miles"), link_key=ref.run_id or str(Path(target).absolute()))
    done = ledger.done_steps()
    todo = [p for p in points if p.step not in done]
    summary = {"mlflow_run_id": ledger.run_id, "tracking_uri": ref.tracking_uri, "linked_run": ledger.linked,
               "already_evaluated": sorted(p.step for p in points if p.step in done), "evaluated": [], "skipped": {}}
    if todo:
        config = _config(ledger, ref, overrides)
        key = f"eval:{get_run_context().flow_run.id}"
        tokenizer_dir = _tokenizer_dir(todo, ref, config)
        timed(prepare_eval, config)(key, config, tokenizer_dir)
        # converted checkpoints, apart from the train flow's snapshots (eval_mode snapshot) of the same run
        export_root = (ref.run_dir or Path(target).absolute().parent) / "eval_snapshots" / "eval-flow"
        trainer_version = _trainer_version(ledger, points)
        try:
            for point in todo:
                result = timed(eval_point, config)(key, point, tokenizer_dir, str(export_root))
                if ledger.record(result, lag_steps=trainer_version - point.step):
                    publish(result)
                    judge_pending(config, ledger.run_id, ref.tracking_uri, result)
                _tally(summary, result)
        finally:
            release_eval(key)
    _summary_artifact(target, summary)
    return summary


def _config(ledger: EvalLedger, ref: RunRef, overrides: dict[str, Any]) -> TrainConfig:
    """The run's config from its MLflow params (recipe file when they are gone), overrides on top."""
    log = get_run_logger()
    values: dict[str, Any] = {}
    if ledger.training_params:
        values = config_values_from_params(ledger.training_params)
    recipe = overrides.get("recipe") or values.get("recipe") or ref.meta.get("recipe")
    try:
        return build_config({**values, **overrides}, source=f"MLflow run {ledger.source_run_id} params")
    except ConfigError as e:
        if not recipe:
            raise ConfigError(f"{e}\nno recipe to fall back on: pass overrides {{'recipe': <name or YAML>}}") from None
        log.warning("the run's params do not make a valid config (%s); using recipe %s", e, recipe)
    return build_config({**read_recipe(recipe), **overrides}, source=f"recipe {recipe}")


def _tokenizer_dir(points, ref: RunRef, config: TrainConfig) -> str:
    snapshots = [p.path for p in points if p.kind == "snapshot"]
    if snapshots:
        return str(snapshots[0])
    saved = ref.meta.get("tokenizer_dir")
    if saved and Path(saved).is_dir():
        return saved
    from miles_core.env import cache_dir
    from miles_core.models import resolve_model_path

    return str(resolve_model_path(config.checkpoint.hf_checkpoint, cache_dir()))


def _trainer_version(ledger: EvalLedger, points) -> int:
    """The weight version the trainer is at: after rollout i it is i + 2 (docs/decisions.md)."""
    rollouts = ledger.client.get_metric_history(ledger.run_id, "rollout/step")
    newest = max((p.step for p in points), default=0)
    return max(newest, max((int(m.value) + 2 for m in rollouts), default=0))


def _tally(summary: dict, result: PointResult) -> None:
    if result.skipped:
        summary["skipped"][result.step] = result.reason
    else:
        summary["evaluated"].append(result.step)


def _summary_artifact(target: str, s: dict) -> None:
    lines = [f"# miles eval of {target}", "", f"- MLflow run: {s['mlflow_run_id']} ({s['tracking_uri']})"
             + (" — a linked run: the training run is gone" if s["linked_run"] else ""),
             f"- evaluated at eval/step: {s['evaluated'] or 'none'}", f"- already evaluated: {s['already_evaluated'] or 'none'}",
             f"- skipped: {s['skipped'] or 'none'}"]
    create_markdown_artifact("\n".join(lines), key="eval-summary", description=f"eval of {target}")


def publish(result: PointResult) -> None:
    """Prefect artifacts of a finished eval: the metrics and the sample completions as tables."""
    step = result.step
    create_table_artifact([{"metric": k, "value": v} for k, v in sorted(result.metrics.items())], key="eval-metrics",
                          description=f"eval metrics at eval/step {step}")
    if result.rows:
        create_table_artifact(result.rows, key="eval-samples", description=f"eval sample completions at eval/step {step}")


# ---- the train flow's eval points ----------------------------------------------------------------
def eval_at(run_key: str, tracker, config: TrainConfig) -> None:
    """An eval point of the train flow at the engines' weight version (inline, or started in the background)."""
    if config.eval.eval_mode == "inline":
        result = timed(evaluate_live, config)(run_key)
        _log(tracker, result)
        _ci_check(run_key, result)
        return
    skip = timed(snapshot_submit, config)(run_key)
    if skip is not None:
        _log(tracker, skip)
    for result in timed(snapshot_collect, config)(run_key):
        _log(tracker, result)
        _ci_check(run_key, result)
        _judge(run_key, tracker, result)


def finish_evals(run_key: str, tracker, config: TrainConfig) -> None:
    """Wait for the background evals of eval_mode snapshot and log them (no-op inline)."""
    if config.eval.eval_mode == "snapshot":
        for result in timed(snapshot_collect, config)(run_key, wait=True):
            _log(tracker, result)
            _ci_check(run_key, result)
            _judge(run_key, tracker, result)


def _ci_check(run_key: str, result: PointResult) -> None:
    """ci_metric_checker_key: an eval point that ran is shown to the run's metric checker (judged at the run's end)."""
    checker = registry.get_runtime(run_key).metric_checker
    if checker is not None and not result.skipped:
        checker.on_eval(result.metrics)


def _judge(run_key: str, tracker, result: PointResult) -> None:
    """A background eval landed after its weights were registered: judge the version that waited for it."""
    cfg = registry.get_runtime(run_key).cfg
    judge_pending(cfg, tracker.mlflow.run_id, cfg.tracking_uri, result)


def _log(tracker, result: PointResult) -> None:
    step = result.step
    if step <= tracker.marks.get("eval/step", -1):  # a resumed run already has this point
        return
    if result.skipped:
        tracker.log_extra(result.metrics, "eval/step", step)
        return
    tracker.log(result.metrics, "eval/step", step)
    tracker.mlflow.log_table(result.rows, f"eval/samples_step_{step}.json")
    publish(result)
    tracker.log_plots()  # MLflow plots/ with this eval point

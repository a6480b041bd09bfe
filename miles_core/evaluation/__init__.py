"""Evaluation (REFERENCE §5): eval datasets, pass@k, inline and snapshot eval, skip reasons, and
what the eval-only flow needs (points on disk, the MLflow run they belong to).

    core.py       evaluate(engine, datasets, ...) -> §5 metrics + sample rows; EvalDataset; eval_params
    spec.py       eval_prompt_data pairs + eval_config YAML (defaults + datasets) -> resolved settings
    suite.py      build_suite(config, tokenizer) -> EvalSuite (tokenized datasets, rewards, eval fn)
    point.py      run_on_engine / run_point: health, weight-version pin, eval -> PointResult or a skip
    skip.py       EvalSkip(reason) and the built-in reasons -> eval/skipped_<reason>
    snapshot.py   SnapshotEvaluator: export + background evals, eval_max_in_flight, overflow policy, retention
    discover.py   the points under a checkpoint / save / export dir and their training run
    ledger.py     the MLflow run eval logs into (or a linked run), idempotent logging, config from params
"""

from .core import EvalDataset, dataset_metrics, eval_params, evaluate
from .point import EvalPoint, EvalRequest, EvalSuite, PointResult, default_eval, load_hf_engine, run_on_engine, run_point
from .skip import BUILTIN_REASONS, EvalSkip, skip_key, skipped_reason
from .snapshot import SnapshotEvaluator
from .suite import build_suite

__all__ = [
    "BUILTIN_REASONS", "EvalDataset", "EvalPoint", "EvalRequest", "EvalSkip", "EvalSuite", "PointResult", "SnapshotEvaluator",
    "build_suite", "dataset_metrics", "default_eval", "eval_params", "evaluate", "load_hf_engine", "run_on_engine", "run_point",
    "skip_key", "skipped_reason",
]

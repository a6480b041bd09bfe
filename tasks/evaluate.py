"""Eval tasks: the eval flow's prepare + one point, and the train flow's snapshot-eval submit/collect.
Live objects (the eval suite, the snapshot evaluator) stay in this process, looked up by key.

No task here raises for a failed eval: every failure is a skip reason in the returned PointResult
(miles_core.evaluation.skip), so a broken point never fails the train flow or the nightly eval.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from miles_core.config import TrainConfig
from miles_core.evaluation import EvalPoint, EvalSuite, PointResult
from miles_core.faults import inject
from miles_core.runtime.registry import get_runtime
from tasks import HOUR, MINUTE

_SUITES: dict[str, tuple[EvalSuite, str]] = {}  # eval key -> (suite, dtype), like runtime/registry.py


@task(name="eval-prepare", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2, timeout_seconds=30 * MINUTE)
def prepare_eval(key: str, config: TrainConfig, tokenizer_dir: str) -> dict:
    """Tokenize the eval datasets of ``config`` with the tokenizer of the weights to evaluate."""
    from transformers import AutoTokenizer

    from miles_core.data.chat_template import with_chat_template
    from miles_core.evaluation import build_suite

    suite = build_suite(config, with_chat_template(AutoTokenizer.from_pretrained(tokenizer_dir), config.data.chat_template_path))
    _SUITES[key] = (suite, config.misc.dtype)
    return {"datasets": {d.name: len(d.prompts) for d in suite.datasets}}


def release_eval(key: str) -> None:
    _SUITES.pop(key, None)


@task(name="eval-point", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2, timeout_seconds=2 * HOUR)
def eval_point(key: str, point: EvalPoint, tokenizer_dir: str, export_root: str) -> PointResult:
    """Evaluate one checkpoint (converted to an HF snapshot under ``export_root`` first, removed after)
    or HF snapshot, on an in-process engine."""
    inject("eval", point.step)
    from miles_core.checkpoint.convert import checkpoint_to_hf
    from miles_core.evaluation import load_hf_engine, run_point

    suite, dtype = _SUITES[key]
    converted: list[Path] = []

    def export(p: EvalPoint) -> Path:
        converted.append(checkpoint_to_hf(p.path, Path(tokenizer_dir), Path(export_root), p.step))
        return converted[-1]

    try:
        return run_point(point, suite, lambda path, version: load_hf_engine(path, version, dtype), export)
    finally:
        for path in converted:
            _remove_snapshot(path)


def _remove_snapshot(path: Path) -> None:
    import shutil

    (path / ".complete").unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)


@task(name="snapshot-eval-submit", cache_policy=NO_CACHE, retries=0, timeout_seconds=HOUR)
def snapshot_submit(run_key: str) -> PointResult | None:
    """Export the live policy as its current weight version and start its background eval (-> a skip result
    when it cannot start: busy, export_failed)."""
    rt = get_runtime(run_key)
    inject("eval", rt.weight_version)
    return rt.snapshot_evals().submit(rt.weight_version, rt.last_trained)


@task(name="snapshot-eval-collect", cache_policy=NO_CACHE, retries=0, timeout_seconds=4 * HOUR)
def snapshot_collect(run_key: str, wait: bool = False) -> list[PointResult]:
    """Results of the background evals that finished (all of them with ``wait``)."""
    return get_runtime(run_key).snapshot_evals().collect(wait)

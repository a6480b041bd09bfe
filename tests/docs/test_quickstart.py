"""The quick start of docs/getting-started.md, run exactly as written (the `<!-- runnable: slow -->` blocks):
the CLI output reads cleanly, and every metric it logged to MLflow is in the catalog."""

from __future__ import annotations

import re

from tools.docs import ROOT
from tools.docs.check import Code, PageCheck, metric_known, runnable_blocks
from tools.docs.markdown import parse


def _run_slow_block(page: str):
    """Run the one `<!-- runnable: slow -->` block of ``page`` as written. -> (the block, its output)."""
    blocks = [b for rel, b in runnable_blocks() if b.run == "slow" and rel == page]
    assert len(blocks) == 1, blocks
    checker = PageCheck(parse(page, ""), Code(), {"slow"})
    out = checker.run_block(blocks[0])
    assert checker.problems == [], "\n".join(map(str, checker.problems))
    return blocks[0], out


def test_the_quick_start_runs_as_written():
    block, out = _run_slow_block("docs/getting-started.md")
    assert "Traceback" not in out and "ERROR" not in out, out
    assert "MLflow run id" in out and "mean reward" in out and "2/2" in out, out

    run_dir = re.search(r"--run-dir (\S+)", block.text).group(1)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{ROOT / run_dir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("miles")
    run = client.search_runs([exp.experiment_id], max_results=1, order_by=["attributes.start_time DESC"])[0]
    keys = set(run.data.metrics)
    assert {"rollout/raw_reward", "train/loss", "eval/arith", "passrate/pass_1", "perf/update_weights_time"} <= keys, keys
    assert [k for k in keys if not metric_known(k)] == []
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "rollout/step")] == [0, 1]


def test_the_conversion_commands_run_as_written():
    """docs/guide/backends.md's HF <-> torch_dist conversion block (the Megatron backend's format)."""
    _, out = _run_slow_block("docs/guide/backends.md")
    assert "Traceback" not in out, out

"""`miles report <run-dir>` on a run in a real MLflow store: the PNG plots (with the series they were
drawn from) and one HTML page with the config, curves, eval table, exports and champion."""

from __future__ import annotations

import json

from PIL import Image
from typer.testing import CliRunner

from flows.cli import app
from miles_core.tracking import MlflowTracker
from miles_core.tracking.plots import read_series


def _run(tmp_path) -> tuple:
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MlflowTracker(store, "report", run_name="tiny · brave-otter", artifact_location=(tmp_path / "mlruns").as_uri())
    tracker.log_params({"rollout": {"num_rollout": 4, "rollout_batch_size": 8}, "algo": {"lr": 1e-4}})
    for i in range(4):
        tracker.log_metrics({"rollout/raw_reward": 0.1 * i, "rollout/response_len/mean": 5.0 + i, "rollout/truncated_ratio": 0.0,
                             "rollout/step": i}, step=i)
        tracker.log_metrics({"train/grad_norm": 1.0 / (i + 1), "train/pg_clipfrac": 0.1, "train/step": i}, step=i)
    for step, value in ((1, 0.2), (3, 0.6), (5, 0.5)):
        tracker.log_metrics({"eval/arith": value, "eval/arith/truncated_ratio": 0.0, "eval/step": step}, step=step)
    tracker.set_tags({"miles.export.00003": "rollout_id=3 train_step=4", "prefect.flow_run_id": "abc"})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "mlflow_run.json").write_text(json.dumps({"run_id": tracker.run_id, "tracking_uri": store}))
    return run_dir, tracker  # left RUNNING: a report of a run still training


def test_report_writes_the_plots_and_one_html_page(tmp_path):
    run_dir, tracker = _run(tmp_path)
    result = CliRunner().invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    out = run_dir / "report"
    page = (out / "index.html").read_text()
    # every plot with data (this run logged no mismatch or staleness key: no mismatch.png)
    assert sorted(p.name for p in out.glob("*.png")) == ["optimization.png", "response_length.png", "reward.png", "truncation.png"]
    with Image.open(out / "reward.png") as img:
        assert img.format == "PNG" and img.size[0] > 600
    series = read_series(out / "reward.png")
    assert [s for s, _ in series["rollout/raw_reward"]] == [0, 1, 2, 3] and [s for s, _ in series["eval/arith"]] == [1, 3, 5]
    assert "tiny · brave-otter" in page and "RUNNING" in page and '<img src="reward.png"' in page
    assert "<td>rollout.num_rollout</td><td>4</td>" in page
    assert "arith: 0.6 at eval/step 3" in page  # the best eval point
    assert "<tr><td>5</td><td>0.5</td></tr>" in page  # the eval table
    assert "rollout_id=3 train_step=4" in page and "prefect.flow_run_id: abc" in page


def test_report_of_a_dir_without_a_run_says_so(tmp_path):
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "mlflow_run.json not found" in " ".join(result.output.split())

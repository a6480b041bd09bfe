"""tools/screenshots.py without a browser: the page URLs it shoots, the Chromium call, and the PNGs the
guides embed (every page it shoots is in docs/images/, embedded in a guide page, and small)."""

from __future__ import annotations

import re
from pathlib import Path

from tools.screenshots import RUN_DIR, WORK, chromium_command, mlflow_pages, prefect_pages

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "docs" / "images"


def test_mlflow_pages_are_the_hash_routes_of_the_run():
    pages = mlflow_pages("http://127.0.0.1:5001", "3", "abc123")
    view = "?workflowType=machine_learning"  # the sidebar's "Model training", not MLflow's default "GenAI"
    assert pages == {
        "mlflow-runs": f"http://127.0.0.1:5001/#/experiments/3/runs{view}",
        "mlflow-run": f"http://127.0.0.1:5001/#/experiments/3/runs/abc123{view}",
        "mlflow-run-charts": f"http://127.0.0.1:5001/#/experiments/3/runs/abc123/model-metrics{view}",
        "mlflow-plots": f"http://127.0.0.1:5001/#/experiments/3/runs/abc123/artifacts/plots/reward.png{view}",
    }


def test_prefect_pages_name_the_flow_run_the_deployment_and_the_summary():
    pages = prefect_pages("http://127.0.0.1:4200", "fr-1", "dep-2", "art-3")
    assert pages["prefect-runs"] == "http://127.0.0.1:4200/runs"
    assert pages["prefect-flow-run"] == "http://127.0.0.1:4200/runs/flow-run/fr-1"
    assert pages["prefect-summary"] == "http://127.0.0.1:4200/artifacts/artifact/art-3"
    assert pages["prefect-deployment"] == "http://127.0.0.1:4200/deployments/deployment/dep-2"
    assert pages["prefect-run-form"] == "http://127.0.0.1:4200/deployments/deployment/dep-2/run"


def test_chromium_renders_headless_into_the_project(tmp_path):
    cmd = chromium_command("http://127.0.0.1:1/x", tmp_path / "a.png", profile=tmp_path / "p", window="800,600", budget_ms=900)
    assert cmd[0] == "chromium" and cmd[-1] == "http://127.0.0.1:1/x"
    assert {"--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=800,600",
            "--virtual-time-budget=900", f"--screenshot={tmp_path / 'a.png'}", f"--user-data-dir={tmp_path / 'p'}"} <= set(cmd)
    assert WORK.is_relative_to(ROOT) and RUN_DIR.is_relative_to(ROOT)


def test_every_page_shot_is_committed_small_and_embedded_in_a_guide():
    names = set(mlflow_pages("u", "e", "r")) | set(prefect_pages("u", "f", "d", "a"))
    assert {p.stem for p in IMAGES.glob("*.png")} == names
    assert all(p.stat().st_size < 300_000 for p in IMAGES.glob("*.png")), "a screenshot over 300 KB: use a smaller --window"
    embedded = set()
    for page in (ROOT / "docs" / "guide").glob("*.md"):
        embedded |= set(re.findall(r"!\[[^\]]+\]\(\.\./images/([\w-]+)\.png\)", page.read_text()))
    assert embedded == names


def test_an_outdir_outside_the_project_is_refused_before_anything_starts(tmp_path, capsys):
    from tools.screenshots import main

    assert main([str(tmp_path / "shots")]) == 2
    assert "outside the project" in capsys.readouterr().err and not (tmp_path / "shots").exists()

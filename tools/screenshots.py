"""Screenshots of the Prefect and MLflow UIs for the guides, taken in headless Chromium.

    python -m tools.screenshots docs/images        (needs Debian's chromium: apt-get install chromium)

Starts `miles serve`'s Prefect server and process worker (flows/serve.py) with a PREFECT_HOME of its own
in .cache/screenshots/, runs the ``train/tiny`` deployment for a few rollouts into runs/screenshots/,
starts ``mlflow ui`` on that run's SQLite store, writes one PNG per page of ``prefect_pages`` and
``mlflow_pages`` into OUTDIR, and stops both servers. .cache/screenshots/ and runs/screenshots/ are
wiped first (each run starts from an empty Prefect database and MLflow store); nothing is written
elsewhere (Chromium's profile and home are in .cache/screenshots/ too).

Two choices make the MLflow pages show what a user sees once settled in: the pages carry
``workflowType=machine_learning`` (the sidebar's "Model training" switch; MLflow 3.17 opens on "GenAI"),
and Chromium reaches the server as ``mlflow.localhost`` (Chromium resolves ``*.localhost`` to loopback):
MLflow's UI opens its Assistant panel over a third of the page on a first visit from
localhost/127.0.0.1 only, and a headless screenshot cannot close it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import flows  # noqa: F401  (environment first)
from flows.links import ML_VIEW

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".cache" / "screenshots"
RUN_DIR = ROOT / "runs" / "screenshots"
OVERRIDES = {"num_rollout": 8, "eval_interval": 4, "eval_prompt_data": ["arith", "builtin://arith-test@[0:32]"],
             "save_interval": 4, "log_samples": 4}
MLFLOW_HOST = "mlflow.localhost"  # what Chromium opens; the server listens on 127.0.0.1
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run")


# ---- pure parts (tested in tests/docs/test_screenshots.py) ---------------------------------------
def mlflow_pages(ui: str, experiment_id: str, run_id: str) -> dict[str, str]:
    """PNG name -> page of the MLflow UI (hash routes of MLflow 3's UI)."""
    experiment = f"{ui}/#/experiments/{experiment_id}"
    run, view = f"{experiment}/runs/{run_id}", ML_VIEW
    return {"mlflow-runs": f"{experiment}/runs{view}", "mlflow-run": f"{run}{view}",
            "mlflow-run-charts": f"{run}/model-metrics{view}", "mlflow-plots": f"{run}/artifacts/plots/reward.png{view}"}


def prefect_pages(ui: str, flow_run_id: str, deployment_id: str, summary_id: str) -> dict[str, str]:
    """PNG name -> page of the Prefect UI (the routes of Prefect 3's UI)."""
    return {"prefect-runs": f"{ui}/runs", "prefect-flow-run": f"{ui}/runs/flow-run/{flow_run_id}",
            "prefect-summary": f"{ui}/artifacts/artifact/{summary_id}",
            "prefect-deployment": f"{ui}/deployments/deployment/{deployment_id}",
            "prefect-run-form": f"{ui}/deployments/deployment/{deployment_id}/run"}


def chromium_command(url: str, png: Path, *, profile: Path, window: str = "1400,900", budget_ms: int = 30000) -> list[str]:
    """The headless Chromium call that renders ``url`` for ``budget_ms`` of virtual time into ``png``."""
    return ["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={window}",
            f"--virtual-time-budget={budget_ms}", f"--screenshot={png}", url]


# ---- servers, the run, the browser ------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _client(url: str):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: url}):
        return get_client(sync_client=True)  # the client keeps the API URL it was built with


def run_deployment(api: str, mlflow_ui: str, timeout_s: float = 1800) -> tuple[str, str, str]:
    """Run ``train/tiny`` with OVERRIDES to a final state -> (flow run id, deployment id, summary artifact id)."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    from flows.recipes import load_config

    cfg = load_config("tiny", {**OVERRIDES, "run_dir": str(RUN_DIR), "mlflow_ui_url": mlflow_ui})
    with _client(api) as client:
        deployment = client.read_deployment_by_name("train/tiny")
        run = client.create_flow_run_from_deployment(deployment.id, parameters={"config": cfg.model_dump(mode="json")})
        deadline = time.monotonic() + timeout_s
        while not (run := client.read_flow_run(run.id)).state.is_final():
            if time.monotonic() > deadline:
                raise TimeoutError(f"flow run {run.id} is {run.state.name} after {timeout_s:.0f}s")
            time.sleep(2)
        if not run.state.is_completed():
            raise RuntimeError(f"flow run {run.id} ended {run.state.name}: {run.state.message}; see {WORK / 'serve'}")
        (summary,) = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]), key=ArtifactFilterKey(any_=["train-summary"])))
    return str(run.id), str(deployment.id), str(summary.id)


def start_mlflow_ui(tracking_uri: str, port: int) -> subprocess.Popen:
    """``mlflow ui`` on 127.0.0.1:``port`` over ``tracking_uri``, reachable as MLFLOW_HOST too; run from WORK
    (what it writes stays there)."""
    import httpx

    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking_uri, "--host", "127.0.0.1", "--port", str(port),
           "--allowed-hosts", f"127.0.0.1:{port},{MLFLOW_HOST}:{port}", "--cors-allowed-origins", f"http://{MLFLOW_HOST}:{port}"]
    proc = subprocess.Popen(cmd, cwd=WORK, stdout=open(WORK / "mlflow.log", "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
                            stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    _stop(proc)
    raise RuntimeError(f"mlflow ui did not come up on port {port}; see {WORK / 'mlflow.log'}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def shoot(pages: dict[str, str], out: Path, **kwargs) -> list[Path]:
    """One PNG per page into ``out`` (-> the files written)."""
    env = {**os.environ, "HOME": str(WORK / "home"), "XDG_CONFIG_HOME": str(WORK / "home" / ".config"),
           "XDG_CACHE_HOME": str(WORK / "home" / ".cache")}
    written = []
    for name, url in pages.items():
        png = out / f"{name}.png"
        cmd = chromium_command(url, png, profile=WORK / "chromium", **kwargs)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        if proc.returncode or not png.exists():
            raise RuntimeError(f"chromium failed on {url} ({proc.returncode}):\n{proc.stderr[-2000:]}")
        print(f"{png}  {png.stat().st_size // 1024} KB  {url}")
        written.append(png)
    return written


def main(argv: list[str] | None = None) -> int:
    from flows.serve import serve, stop

    p = argparse.ArgumentParser(prog="python -m tools.screenshots", description=__doc__.split("\n")[0])
    p.add_argument("outdir", type=Path, help="where the PNGs go (docs/images)")
    p.add_argument("--window", default="1400,900", help="Chromium window size W,H")
    p.add_argument("--budget-ms", type=int, default=30000, help="virtual time each page gets to load")
    args = p.parse_args(argv)
    if not args.outdir.absolute().is_relative_to(ROOT):
        print(f"{args.outdir} is outside the project ({ROOT}): give a dir inside it, such as docs/images", file=sys.stderr)
        return 2
    if shutil.which("chromium") is None:
        print("chromium is not on PATH: apt-get install chromium (Debian's package)", file=sys.stderr)
        return 1
    stop(WORK / "serve")  # what an interrupted earlier run left, by its pid files
    shutil.rmtree(WORK, ignore_errors=True)
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    WORK.mkdir(parents=True)
    args.outdir.mkdir(parents=True, exist_ok=True)
    mlflow_port = _free_port()
    mlflow_ui = f"http://127.0.0.1:{mlflow_port}"
    info = serve(_free_port(), WORK / "serve", env={"PREFECT_HOME": str(WORK / "prefect")})
    try:
        flow_run_id, deployment_id, summary_id = run_deployment(info["url"], mlflow_ui)
        marker = json.loads((RUN_DIR / "mlflow_run.json").read_text())
        mlflow = start_mlflow_ui(marker["tracking_uri"], mlflow_port)
        try:
            from miles_core.tracking.mlflow_tracker import mlflow_client

            experiment_id = mlflow_client(marker["tracking_uri"]).get_run(marker["run_id"]).info.experiment_id
            pages = {**prefect_pages(info["ui"], flow_run_id, deployment_id, summary_id),
                     **mlflow_pages(f"http://{MLFLOW_HOST}:{mlflow_port}", experiment_id, marker["run_id"])}
            shoot(pages, args.outdir, window=args.window, budget_ms=args.budget_ms)
        finally:
            _stop(mlflow)
    finally:
        stop(WORK / "serve")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

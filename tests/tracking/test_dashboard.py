"""use_miles_dashboard and the dashboard_* fields, for real: a tiny run through the Prefect flow over one of our HTTP
engine servers on 127.0.0.1 (serving /metrics with --enable-metrics), its <run_dir>/dashboard/ files read back, the
forwarded gauges scraped from the Prometheus endpoint, the files served by `miles dashboard`, the refusals."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch
from mlflow.tracking import MlflowClient
from prometheus_client.parser import text_string_to_metric_families

import flows  # noqa: F401  (environment first)
from flows.recipes import load_config
from flows.tracking import open_run
from miles_core.assemble import build_config
from miles_core.config import ConfigError
from miles_core.rollout.http.launch import serve_in_thread
from miles_core.rollout.http.engine import HFEngine
from miles_core.tracking.dashboard.server import make_server
from miles_core.tracking.dashboard.store import read_meta, read_stream

KEPT = "sglang:num_running_reqs,sglang_generation_tokens_total"  # one gauge in SGLang's spelling, one counter sample
FAST = {"dashboard_gpu_sample_interval": 0.05, "dashboard_sglang_scrape_interval": 0.05, "dashboard_flush_interval": 0.1}
SAMPLER = "host" if not torch.cuda.is_available() else None  # a GPU machine: nvml or torch.cuda (asserted below)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One SQLite store for the module's runs (creating one costs seconds of schema migrations)."""
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"


@pytest.fixture(scope="module")
def engine(tiny_model_dir, one_torch_thread):
    handle = serve_in_thread(HFEngine.from_pretrained(tiny_model_dir, batching="exact"), model_path=str(tiny_model_dir),
                             enable_metrics=True)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def run(tmp_path_factory, engine, store, prefect_harness):
    """One tiny run of 2 rollouts over the engine, with the dashboard on at short intervals."""
    from flows.train import train

    cfg = load_config("tiny", {"run_dir": str(tmp_path_factory.mktemp("dash") / "run"), "num_rollout": 2,
                               "eval_interval": None, "skip_eval_before_train": True, "log_samples": 0, "mlflow_tracking_uri": store,
                               "rollout_external_engine_addrs": [engine.url.removeprefix("http://")],
                               "use_miles_dashboard": True, "dashboard_sglang_metrics": KEPT, **FAST})
    summary = train(cfg)
    return cfg, summary


def _check_sampler(meta: dict) -> None:
    assert meta["device_sampler"] == SAMPLER if SAMPLER else meta["device_sampler"] in ("nvml", "torch.cuda")


def test_a_run_with_the_dashboard_writes_its_streams_at_the_configured_cadence(run, engine):
    cfg, summary = run
    root = cfg.run_dir / "dashboard"
    meta = read_meta(root)
    _check_sampler(meta)
    assert meta["intervals"] == {"flush": 0.1, "gpu_sample": 0.05, "sglang_scrape": 0.05}
    assert meta["metric_names"] == ["sglang_generation_tokens_total", "sglang_num_running_reqs"] and meta["scrape_mode"] == "direct"
    # every row the trackers logged: both rollouts and their train steps
    rows = read_stream(root, "metrics")
    assert [r["step"] for r in rows if r["axis"] == "rollout/step" and "rollout/raw_reward" in r["metrics"]] == [0, 1]
    assert {r["axis"] for r in rows} >= {"rollout/step", "train/step"}
    # device samples every 0.05 s over a run of seconds: many (loosely), each a real reading
    samples = read_stream(root, "host" if meta["device_sampler"] == "host" else "gpu_util")
    assert len(samples) >= 5
    assert all(s["mem_mb"] > 0 for s in samples)
    # the engine's /metrics, kept by name: the two listed, not the gen_throughput gauge it also serves
    series = read_stream(root, "engine_series")
    assert {s["metric"] for s in series} == {"sglang_num_running_reqs", "sglang_generation_tokens_total"}
    assert {s["addr"] for s in series} == {engine.url} and {s["labels"]["engine_type"] for s in series} == {"unified"}
    assert len(series) >= 10  # scraped every 0.05 s (two series each time)
    tokens = [s["value"] for s in series if s["metric"] == "sglang_generation_tokens_total"]
    assert tokens == sorted(tokens) and tokens[-1] > tokens[0]  # the run generated on this engine while it was scraped
    # the files went to the MLflow run at the end
    client = MlflowClient(cfg.tracking_uri)
    names = {a.path for a in client.list_artifacts(summary["mlflow_run_id"], "dashboard")}
    assert {"dashboard/meta.json", "dashboard/metrics.jsonl", "dashboard/engine_series.jsonl"} <= names
    tags = client.get_run(summary["mlflow_run_id"]).data.tags
    assert tags["miles.dashboard"] == str(root)


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_miles_dashboard_serves_the_run_as_json_on_localhost(run):
    cfg, _ = run
    server = make_server(cfg.run_dir, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        index = _get(base + "/")
        assert index["streams"]["metrics"] > 0 and index["streams"]["engine_series"] > 0
        _check_sampler(_get(base + "/api/meta"))
        series = _get(base + "/api/engine_series")
        later = _get(f"{base}/api/engine_series?since={series[len(series) // 2]['ts']}")
        assert 0 < len(later) < len(series) and all(r["ts"] > series[len(series) // 2]["ts"] for r in later)
        assert len(_get(base + "/api/metrics?limit=2")) == 2
        latest = _get(base + "/api/latest")
        assert set(latest["metrics"]) >= {"rollout/step", "train/step"}
        for path, status in (("/api/nope", 404), ("/api/metrics?since=soon", 400)):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(base + path, timeout=10)
            assert e.value.code == status
    finally:
        server.shutdown()
        server.server_close()


def test_a_run_dir_without_a_dashboard_is_named_with_the_field(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    with pytest.raises(FileNotFoundError, match="use_miles_dashboard"):
        make_server(tmp_path)
    result = CliRunner().invoke(app, ["dashboard", str(tmp_path), "--port", "0"], env={"COLUMNS": "400"})
    assert result.exit_code == 2 and "use_miles_dashboard" in result.output, result.output


def _scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_forwarded_samples_are_gauges_on_the_prometheus_endpoint(tmp_path, engine, store):
    cfg = load_config("tiny", {"run_dir": str(tmp_path / "run"), "mlflow_tracking_uri": store, "use_miles_dashboard": True, "use_prometheus": True,
                               "prometheus_port": 0, "dashboard_forward_prometheus": True, **FAST})
    tracker = open_run(cfg, None, {}, engine_urls=lambda: [engine.url])
    prom = next(m for m in tracker.mirrors if m.name == "prometheus")
    port = engine.url.rsplit(":", 1)[1]
    wanted = {f"miles_dashboard_engine_127_0_0_1_{port}_running_reqs"}
    wanted |= {"miles_dashboard_host_cpu_util", "miles_dashboard_host_mem_mb"} if SAMPLER else set()
    deadline, seen = time.monotonic() + 30, {}
    while time.monotonic() < deadline and not wanted <= set(seen):  # until a flush forwarded them (every 0.1 s)
        seen = _scrape(prom.link)
        time.sleep(0.05)
    assert wanted <= set(seen), sorted(seen)
    if SAMPLER:
        assert seen["miles_dashboard_host_mem_mb"] > 0
    tracker.end("FINISHED")


def test_without_forwarding_the_prometheus_endpoint_has_no_dashboard_gauges(tmp_path, engine, store):
    cfg = load_config("tiny", {"run_dir": str(tmp_path / "run"), "mlflow_tracking_uri": store, "use_miles_dashboard": True, "use_prometheus": True,
                               "prometheus_port": 0, **FAST})
    tracker = open_run(cfg, None, {}, engine_urls=lambda: [engine.url])
    dash = next(m for m in tracker.mirrors if m.name == "dashboard")
    tracker.log({"rollout/raw_reward": 0.5}, "rollout/step", 0)
    dash.scrape_once()
    dash.flush_once()  # what a flush tick does: no forwarding configured
    prom = next(m for m in tracker.mirrors if m.name == "prometheus")
    names = set(_scrape(prom.link))
    assert "miles_rollout_raw_reward" in names and not {n for n in names if n.startswith("miles_dashboard_")}
    tracker.end("FINISHED")
    assert read_stream(cfg.run_dir / "dashboard", "engine_series")  # scraped all the same (every default name it serves)


BASE = {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "prompt_data": "builtin://arith"}


@pytest.mark.parametrize(("values", "message"), [
    ({"dashboard_flush_interval": 1.0}, "dashboard_flush_interval applies only with use_miles_dashboard"),
    ({"dashboard_gpu_sample_interval": 2.0, "dashboard_forward_prometheus": True},
     "dashboard_gpu_sample_interval, dashboard_forward_prometheus apply only with use_miles_dashboard"),
    ({"use_miles_dashboard": True, "dashboard_sglang_scrape_mode": "router"}, "dashboard_sglang_scrape_mode router is not supported yet"),
    ({"use_miles_dashboard": True, "dashboard_sglang_scrape_mode": "sometimes"}, "dashboard_sglang_scrape_mode"),
    ({"use_miles_dashboard": True, "dashboard_forward_prometheus": True}, "dashboard_forward_prometheus .* set use_prometheus"),
    ({"use_miles_dashboard": True, "dashboard_sglang_metrics": " , "}, "dashboard_sglang_metrics ' , ' names no metric"),
    ({"use_miles_dashboard": True, "dashboard_sglang_scrape_interval": 0}, "dashboard_sglang_scrape_interval"),
    ({"use_miles_dashboard": True, "dashboard_flush_interval": float("inf")}, "dashboard_flush_interval: Input should be a finite"),
])
def test_a_dashboard_option_that_cannot_apply_is_refused_naming_the_field(values, message):
    with pytest.raises(ConfigError, match=message):
        build_config({**BASE, **values})


def test_direct_and_auto_load(tmp_path):
    for mode in ("auto", "direct"):
        c = build_config({**BASE, "use_miles_dashboard": True, "dashboard_sglang_scrape_mode": mode,
                          "dashboard_sglang_metrics": "sglang:num_queue_reqs, sglang_gen_throughput"})
        assert c.tracking.dashboard_metric_names == ("sglang_num_queue_reqs", "sglang_gen_throughput")


def test_the_engines_miles_launches_serve_metrics_with_the_dashboard():
    from miles_core.rollout.sglang.launch import EngineLaunch, launch_command
    from miles_core.runtime.ray.engines import hf_server_args

    spec = EngineLaunch(model_path="/m", host="h", port=1, api_key="K")
    sglang = {"runtime": "ray", "rollout_engine": "sglang"}
    for on in (False, True):
        dash = {"use_miles_dashboard": True} if on else {}
        assert ("--enable-metrics" in launch_command(load_config("tiny", {**sglang, **dash}), spec)) is on
        assert ("--enable-metrics" in hf_server_args(load_config("tiny", {"runtime": "ray", **dash}))) is on

"""The tiny recipe over engines already running (rollout_external_engine_addrs): two of our HTTP servers,
real processes on 127.0.0.1 started here with an API key, through the real Prefect flow. Nothing is
launched by the run; both engines serve rollouts and every sync reaches both: on the local runtime by
tensor (the default there), on Ray (the train rank placed alone, a real local Ray) by broadcast (its
default: the engines join a gloo group hosted by train rank 0)."""

from __future__ import annotations

import pytest
import torch
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

import flows  # noqa: F401  (environment first)
from flows.recipes import load_config
from miles_core.config.rollout import API_KEY_ENV
from miles_core.rollout.http import HTTPEngineClient, spawn_server_process
from miles_core.rollout.sglang.launch import new_api_key

NUM_ROLLOUT = 3
KEY = new_api_key()
PROBE = "model.layers.0.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def two_servers(tiny_model_dir):
    """Shared by both runtimes' runs: the second run's first sync (before training) replaces the first run's
    trained weights, which the log-prob check below would catch if it did not."""
    procs = [spawn_server_process(tiny_model_dir, ["--num-threads", "1", "--batching", "exact"], api_key=KEY) for _ in range(2)]
    try:
        yield [p.wait_ready() for p in procs]
    finally:
        for p in procs:
            p.stop()


def _history(client: MlflowClient, run_id: str, key: str) -> list[float]:
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("runtime", ["local", "ray"])
def test_tiny_recipe_over_two_external_engines(tmp_path, two_servers, monkeypatch, runtime, tiny_model_dir):
    from flows.train import train

    monkeypatch.setenv(API_KEY_ENV, KEY)  # the key the servers were started with
    clients = [HTTPEngineClient(p.url, api_key=KEY) for p in two_servers]
    start = load_file(tiny_model_dir / "model.safetensors")[PROBE]  # the checkpoint's (the engines may hold a previous run's)
    before = [c.server_info()["stats"] for c in clients]
    addrs = [p.url.removeprefix("http://") for p in two_servers]  # the reference's host:port form
    cfg = load_config("tiny", {"run_dir": str(tmp_path / "run"), "num_rollout": NUM_ROLLOUT, "eval_interval": None,
                               "skip_eval_before_train": True, "rollout_external_engine_addrs": addrs, "runtime": runtime})
    assert cfg.cluster.weight_sync_mode == {"local": "tensor", "ray": "broadcast"}[runtime]
    summary = train(cfg)
    run = MlflowClient(cfg.tracking_uri).get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    history = lambda key: _history(MlflowClient(cfg.tracking_uri), run.info.run_id, key)  # noqa: E731
    # rollout i was generated at weight version i + 1 (the sync before it reached the engines that served it) ...
    assert history("rollout/weight_version/mean") == [float(i + 1) for i in range(NUM_ROLLOUT)]
    # ... and by the trainer's weights: the engines' log-probs equal the trainer's
    assert max(history("train/train_rollout_logprob_abs_diff")) < 1e-5
    final = NUM_ROLLOUT + 1  # the sync before training, then one after each rollout
    for c, was in zip(clients, before):
        info = c.server_info()
        assert info["stats"]["requests_completed"] > was["requests_completed"], info["stats"]  # both engines served this run
        assert info["weight_version"] == str(final) and info["stats"]["weight_buckets"] - was["weight_buckets"] >= final
    probes = [c.get_weights_by_name(PROBE) for c in clients]
    assert torch.equal(probes[0], probes[1]) and not torch.equal(probes[0], start)  # trained weights, on both engines
    for c in clients:
        c.close()

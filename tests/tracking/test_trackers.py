"""The tracker fan-out with the real libraries: W&B offline (its history read back from its own
transaction log), TensorBoard event files read back, Prometheus /metrics over 127.0.0.1, and a resume
into the same MLflow run that duplicates no step on any tracker."""

from __future__ import annotations

import urllib.request

import pytest
from mlflow.tracking import MlflowClient
from prometheus_client.parser import text_string_to_metric_families

from flows.tracking import open_run
from flows.recipes import load_config
from miles_core.tracking.prometheus_tracker import PrometheusMirror
from miles_core.tracking.tensorboard_tracker import read_scalars
from miles_core.tracking.wandb_tracker import RECORD, read_history


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One SQLite store for the module's runs (creating one costs seconds of schema migrations)."""
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"


def _config(tmp_path, store, **trackers):
    return load_config("tiny", {"run_dir": str(tmp_path / "run"), "mlflow_tracking_uri": store, "wandb_mode": "offline",
                                "prometheus_port": 0, **trackers})


def _rollouts(tracker, steps) -> None:
    for i in steps:
        tracker.log({"rollout/raw_reward": 0.1 * i, "passrate/pass@8": 0.5}, "rollout/step", i)
        tracker.log({"train/loss": 1.0 - 0.1 * i}, "train/step", i)
        tracker.log_extra({"perf/save_model_time": 0.25}, "rollout/step", i)


def _named(tracker) -> dict:
    return {m.name: m for m in tracker.mirrors}


def _scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_every_tracker_gets_the_same_keys_at_the_same_axes(tmp_path, store):
    cfg = _config(tmp_path, store, use_wandb=True, use_tensorboard=True, use_prometheus=True)
    tracker = open_run(cfg, None, {})
    assert [m.name for m in tracker.mirrors] == ["log", "wandb", "tensorboard", "prometheus"]
    _, wandb, tb, prom = tracker.mirrors
    _rollouts(tracker, range(3))
    live = _scrape(prom.link)  # while the run lives
    assert prom.link.startswith("http://127.0.0.1:")
    assert live["miles_rollout_raw_reward"] == 0.2 and live["miles_rollout_step"] == 2 and live["miles_passrate_pass_8"] == 0.5
    tracker.end("FINISHED")

    tags = MlflowClient(cfg.tracking_uri).get_run(tracker.mlflow.run_id).data.tags
    assert tags["miles.tensorboard"] == str(tb.logdir) and tags["miles.prometheus"] == prom.link
    scalars = read_scalars(tb.logdir)
    assert [s for s, _ in scalars["rollout/raw_reward"]] == [0, 1, 2]
    assert [v for _, v in scalars["rollout/raw_reward"]] == pytest.approx([0.0, 0.1, 0.2])  # float32 in event files
    assert [s for s, _ in scalars["passrate/pass_8"]] == [0, 1, 2]  # the key MLflow has (sanitized)
    assert [s for s, _ in scalars["train/loss"]] == [0, 1, 2] and [s for s, _ in scalars["perf/save_model_time"]] == [0, 1, 2]

    rows = read_history(cfg.run_dir, wandb.run.id)
    rewards = [(r["rollout/step"], r["rollout/raw_reward"]) for r in rows if "rollout/raw_reward" in r]
    assert rewards == [(0, 0.0), (1, 0.1), (2, 0.2)]
    assert [r["train/step"] for r in rows if "train/loss" in r] == [0, 1, 2]
    assert sum("perf/save_model_time" in r for r in rows) == 3
    try:
        urllib.request.urlopen(prom.link, timeout=2)
        raise AssertionError("the /metrics endpoint outlived the run")
    except OSError:
        pass


def test_resume_duplicates_no_step_on_any_tracker(tmp_path, store):
    cfg = _config(tmp_path, store, use_wandb=True, use_tensorboard=True)
    first = open_run(cfg, None, {})
    _rollouts(first, range(4))
    for name in ("wandb", "tensorboard"):  # the mirrors got step 4 ...
        _named(first)[name].log({"rollout/raw_reward": 0.4, "rollout/step": 4}, "rollout/step", 4)
    first.mlflow.flush()  # ... MLflow did not (the process died before)
    first.close("FAILED")  # the crash: mirrors closed by the flow's finally, the MLflow run left RUNNING
    wandb_id = _named(first)["wandb"].run.id

    resumed = open_run(cfg, first.mlflow.run_id, {})  # a rerun from the checkpoint of rollout 1 logs 2..5 again
    mirrors = _named(resumed)
    assert resumed.marks["rollout/step"] == 3 and [mirrors[n].marks["rollout/step"] for n in ("wandb", "tensorboard")] == [4, 4]
    assert mirrors["wandb"].run.id == wandb_id  # the same W&B run, from <run_dir>/wandb_run.json
    _rollouts(resumed, range(2, 6))
    resumed.end("FINISHED")

    client = MlflowClient(cfg.tracking_uri)
    assert [m.step for m in client.get_metric_history(first.mlflow.run_id, "rollout/step")] == list(range(6))
    assert [m.step for m in client.get_metric_history(first.mlflow.run_id, "train/step")] == list(range(6))
    tb = read_scalars(mirrors["tensorboard"].logdir)
    assert [s for s, _ in tb["rollout/step"]] == list(range(6)) and [s for s, _ in tb["train/step"]] == list(range(6))
    rows = read_history(cfg.run_dir, wandb_id)
    assert [r["rollout/step"] for r in rows if "rollout/raw_reward" in r] == list(range(6))
    assert [r["train/step"] for r in rows if "train/loss" in r] == list(range(6))
    assert (cfg.run_dir / RECORD).exists()


def test_wandb_always_use_train_step_plots_rollouts_and_evals_at_train_steps(tmp_path, store):
    """The reference's compute_rollout_step: rollout i at i * num_steps_per_rollout (4 here), the eval after rollout i
    (eval/step i + 2) at i * 4, the one before training (eval/step 1) at 0; train/step and MLflow unchanged."""
    import json

    cfg = _config(tmp_path, store, use_wandb=True, wandb_always_use_train_step=True, num_steps_per_rollout=4,
                  micro_batch_size=8)
    tracker = open_run(cfg, None, {})
    tracker.log({"eval/arith": 0.1}, "eval/step", 1)  # before training
    for i in range(3):
        tracker.log({"rollout/raw_reward": 0.1 * i}, "rollout/step", i)
        for k in range(4):
            tracker.log({"train/loss": 1.0}, "train/step", 4 * i + k)
        tracker.log({"eval/arith": 0.2 + i}, "eval/step", i + 2)
    tracker.log_extra({"eval/duration_seconds": 1.0}, "eval/step", 4)
    tracker.end("FINISHED")
    rows = read_history(cfg.run_dir, _named(tracker)["wandb"].run.id)
    assert [r["rollout/step"] for r in rows if "rollout/raw_reward" in r] == [0, 4, 8]
    assert [(r["eval/step"], r["eval/arith"]) for r in rows if "eval/arith" in r] == [(0, 0.1), (0, 0.2), (4, 1.2), (8, 2.2)]
    assert [r["eval/step"] for r in rows if "eval/duration_seconds" in r] == [8]
    assert [r["train/step"] for r in rows if "train/loss" in r] == list(range(12))
    client = MlflowClient(cfg.tracking_uri)
    assert [m.step for m in client.get_metric_history(tracker.mlflow.run_id, "eval/arith")] == [1, 2, 3, 4]
    assert json.loads((cfg.run_dir / RECORD).read_text())["marks"] == {"eval/step": 4, "rollout/step": 2, "train/step": 11}


def test_a_new_mlflow_run_gets_a_new_wandb_run(tmp_path, store):
    cfg = _config(tmp_path, store, use_wandb=True, wandb_dir=str(tmp_path / "wb"))
    first = open_run(cfg, None, {})
    first.end("FINISHED")
    second = open_run(cfg, None, {})  # mlflow_new_run, or a fresh run dir record
    second.end("FINISHED")
    assert _named(first)["wandb"].run.id != _named(second)["wandb"].run.id
    assert (tmp_path / "wb" / "wandb").is_dir()


def test_wandb_host_names_the_server_of_the_wandb_run(tmp_path, store):
    """The reference's --wandb-host: the W&B run's server (offline here: recorded in the run's settings, nothing sent;
    without it W&B's own default or WANDB_BASE_URL)."""
    tracker = open_run(_config(tmp_path, store, use_wandb=True, wandb_host="http://wandb.example:8080/"), None, {})
    try:
        assert _named(tracker)["wandb"].run.settings.base_url == "http://wandb.example:8080"
    finally:
        tracker.end("FINISHED")


def test_a_busy_prometheus_port_is_a_clear_error():
    holder = PrometheusMirror("127.0.0.1", 0, {"run_id": "a", "run_name": "tiny"})
    port = int(holder.link.rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(OSError, match=f"prometheus_port {port}"):
        PrometheusMirror("127.0.0.1", port, {"run_id": "b", "run_name": "tiny"})
    holder.close("FINISHED")


def test_tb_project_and_experiment_name_place_the_event_files(tmp_path, store):
    """The reference's --tb-project-name / --tb-experiment-name: <tensorboard_dir>/<project>/<experiment>/ instead of
    <tensorboard_dir>/<MLflow run id>/; the scalars land there."""
    tracker = open_run(_config(tmp_path, store, use_tensorboard=True, tensorboard_dir=str(tmp_path / "tb"),
                               tb_project_name="proj", tb_experiment_name="exp1"), None, {})
    _rollouts(tracker, range(2))
    tracker.end("FINISHED")
    assert _named(tracker)["tensorboard"].logdir == tmp_path / "tb" / "proj" / "exp1"
    assert [s for s, _ in read_scalars(tmp_path / "tb" / "proj" / "exp1")["rollout/raw_reward"]] == [0, 1]


def test_prometheus_run_name_is_the_run_name_label(tmp_path, store):
    tracker = open_run(_config(tmp_path, store, use_prometheus=True, prometheus_run_name="my-run"), None, {})
    try:
        _rollouts(tracker, range(1))
        text = urllib.request.urlopen(_named(tracker)["prometheus"].link, timeout=10).read().decode()
        labels = [s.labels for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == "miles_rollout_raw_reward"]
        assert labels == [{"run_id": tracker.mlflow.run_id, "run_name": "my-run"}]
    finally:
        tracker.end("FINISHED")


def test_wandb_group_takes_the_reference_s_random_suffix_unless_disabled(tmp_path, store):
    """The reference's init_wandb_primary: group <wandb_group>_<8 characters>, run <group>-RANK_0 (the same group on
    resume); disable_wandb_random_suffix: both wandb_group; no wandb_group: no group, the MLflow run's name."""
    cfg = _config(tmp_path, store, use_wandb=True, wandb_group="exp")
    first = open_run(cfg, None, {})
    run = _named(first)["wandb"].run
    group, name = run.group, run.name
    first.close("FAILED")
    assert group.startswith("exp_") and len(group) == len("exp_") + 8 and name == f"{group}-RANK_0"
    resumed = open_run(cfg, first.mlflow.run_id, {})
    try:
        assert (_named(resumed)["wandb"].run.group, _named(resumed)["wandb"].run.name) == (group, name)
    finally:
        resumed.end("FINISHED")
    seen = {}
    for key, over in (("other", {"wandb_group": "exp"}), ("fixed", {"wandb_group": "exp", "disable_wandb_random_suffix": True}),
                      ("plain", {"mlflow_run_name": "my-run"})):
        tracker = open_run(_config(tmp_path / key, store, use_wandb=True, **over), None, {})
        seen[key] = _named(tracker)["wandb"].run.group, _named(tracker)["wandb"].run.name
        tracker.end("FINISHED")
    assert seen["other"][0] not in (group, "exp")  # a new run: a new suffix
    assert seen["fixed"] == ("exp", "exp")
    assert not seen["plain"][0] and seen["plain"][1] == "my-run"


def test_wandb_s_import_time_directories_are_made_under_the_project_cache(tmp_path):
    """wandb makes two temporary directories when imported; a SIGKILLed run left them in /tmp. Through the mirror's
    import they are beside WANDB_CACHE_DIR (under the project's cache), and tempfile's own default is left as it was."""
    import os
    import subprocess
    import sys

    code = ("import tempfile; from miles_core.tracking.wandb_tracker import _wandb; _wandb();"
            "from wandb.sdk.data_types._private import MEDIA_TMP; from wandb.sdk.artifacts.artifact import Artifact;"
            "print(MEDIA_TMP.name); print(Artifact._TMP_DIR.name); print(tempfile.gettempdir())")
    env = {**os.environ, "WANDB_CACHE_DIR": str(tmp_path / "cache" / "wandb" / "cache")}  # miles_core/env.py's default
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert all(p.startswith(str(tmp_path / "cache" / "wandb" / "tmp")) for p in out[:2]), out
    assert not out[2].startswith(str(tmp_path)), out

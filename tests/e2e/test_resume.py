"""Kill a run after a checkpoint, rerun it: every logged metric at every step equals the uninterrupted run's, and
the MLflow run has no duplicate or missing steps. Two cases: SIGKILL of the multi-turn tiny-tools recipe (tool
calls, loss-mask holes, multi_turn/* metrics) with async_mode one_step, where the checkpoint counts on the rollout
generated ahead of it; and Ctrl-C (SIGINT to the process group) of tiny on the Megatron trainer in bf16 (its torch_dist
checkpoint: fp32 main weights, optimizer, RNG, step count), which must stop within 10 s with its MLflow run KILLED and tagged
(flows/interrupt.py). The uninterrupted run goes beside the killed one and talks to the session's Prefect server, as
under `miles serve`; so does the SIGKILLed run. The interrupted one has its own ephemeral API, as a plain
`miles train` at a terminal does (the signal to its process group must not take that API down under it; so does
the SIGKILL before the first checkpoint below, as a crash of a plain `miles train` would).

Exact on CPU: sampling is seeded per (seed, rollout id), the data cursor, optimizer, RNG and step
count come back from the checkpoint, and torch CPU kernels are deterministic for a fixed thread count.
Timings (perf/*, eval/duration_seconds) are the only metrics excluded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[2]
N = 2  # checkpoints after rollouts 0 and 1: the kill after the first, the rerun does rollout 1 (with its eval)
ARGS = ["--num-rollout", str(N), "--save-interval", "1", "--eval-interval", str(N), "--rollout-batch-size", "4",
        "--num-threads", "1"]


def _cli(run_dir: Path, mode: str, recipe: str, backend: str, dtype: str = "float32") -> list[str]:
    return [sys.executable, "-m", "flows.cli", "train", recipe, "--run-dir", str(run_dir), *ARGS, "--async-mode", mode,
            "--train-backend", backend, "--dtype", dtype]


def _gone(pgid: int, within_s: float) -> bool:
    """Whether no process of group ``pgid`` is left (zombies aside) within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while True:
        alive = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _in_group(p, pgid)]
        if not alive:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _in_group(proc: Path, pgid: int) -> bool:
    try:
        fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[2]) == pgid


def _tags(run_dir: Path) -> dict[str, str]:
    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("miles").experiment_id])
    return run.data.tags


def _metrics(run_dir: Path) -> tuple[str, dict[str, list[tuple[int, float]]]]:
    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("miles")
    (run,) = client.search_runs([exp.experiment_id])
    out = {}
    for key in run.data.metrics:
        if key.startswith("perf/") or key == "eval/duration_seconds":
            continue
        out[key] = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
    return run.info.status, out


# Torch with async_mode off on tiny is the case below the SIGKILL before the first checkpoint, and the fault-injection
# resumes (tests/e2e/test_fault_inject.py); here: multi-turn one_step on torch, off on megatron (suite time).
# The Megatron case runs in bf16 (fp32 main weights in the torch_dist checkpoint, bf16 engines): the flow-level
# check of that trainer in bf16 (tests/e2e/test_algorithms_e2e.py learns in bf16 on the torch trainer).
@pytest.mark.parametrize("recipe, mode, backend, dtype, sig", [("tiny-tools", "one_step", "torch", "float32", signal.SIGKILL),
                                                               ("tiny", "off", "megatron", "bfloat16", signal.SIGINT)],
                         ids=["sigkill", "sigint"])
def test_a_killed_or_interrupted_run_reruns_to_the_uninterrupted_runs_metrics(request, tmp_path, tiny_model_dir, prefect_api_url,
                                                                               recipe, mode, backend, dtype, sig):
    if recipe == "tiny-tools":  # its model built once here (cached), not by both runs at once
        from miles_core.env import cache_dir
        from miles_core.models import resolve_model_path

        resolve_model_path("builtin://tiny-qwen2-tools", cache_dir())
    env = {**os.environ, "COLUMNS": "120", "PREFECT_API_URL": prefect_api_url}
    full, killed = tmp_path / "full", tmp_path / "killed"
    # the uninterrupted run beside the one to kill (one thread each: the numbers do not depend on the other process)
    log = tmp_path / "full.log"
    with log.open("w") as out:
        uninterrupted = subprocess.Popen(_cli(full, mode, recipe, backend, dtype), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    request.addfinalizer(lambda: uninterrupted.poll() is None and uninterrupted.kill())
    # its own process group, as a terminal's foreground job: the signal goes to the whole group
    own_api = {k: v for k, v in env.items() if k != "PREFECT_API_URL"} if sig == signal.SIGINT else env
    with (tmp_path / "killed.log").open("w") as out:
        proc = subprocess.Popen(_cli(killed, mode, recipe, backend, dtype), cwd=ROOT, env=own_api, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    request.addfinalizer(lambda: _gone(proc.pid, 0) or os.killpg(proc.pid, signal.SIGKILL))
    latest = killed / "checkpoints" / "latest"
    deadline = time.time() + 600
    while time.time() < deadline and not (latest.exists() and latest.read_text().strip() == "0"):
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    os.killpg(proc.pid, sig)
    assert _gone(proc.pid, 10.0), f"the process group of the run is still there 10 s after {sig.name}"
    proc.wait(timeout=5)
    said = (tmp_path / "killed.log").read_text()
    assert latest.read_text().strip() == "0"
    status, _ = _metrics(killed)
    if sig == signal.SIGKILL:
        assert status == "RUNNING"  # no hook ran
    else:
        assert proc.returncode == 130, said
        tags = _tags(killed)
        assert status == "KILLED" and tags["miles.failure"] == "interrupted", (status, tags, said)
        assert tags["miles.interrupted"].startswith("SIGINT") and tags["miles.resume_from_rollout"] == "1", tags
        assert "interrupted (SIGINT)" in said and "is KILLED" in said and "ConnectError" not in said, said

    rerun = subprocess.run(_cli(killed, mode, recipe, backend, dtype), cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "resumed from 1" in rerun.stdout
    assert uninterrupted.wait(timeout=900) == 0, log.read_text()[-3000:]

    status_full, want = _metrics(full)
    status_killed, got = _metrics(killed)
    assert status_full == status_killed == "FINISHED"
    assert set(got) == set(want)
    for key in want:
        steps = [s for s, _ in got[key]]
        assert len(steps) == len(set(steps)), f"duplicate steps in {key}: {steps}"
        assert got[key] == want[key], key
    assert [s for s, _ in want["rollout/raw_reward"]] == list(range(N))
    if dtype == "bfloat16":  # bf16 engines sample from the weights the fp32 main weights became (test_algorithms_e2e's bound)
        assert max(v for _, v in want["train/train_rollout_logprob_abs_diff"]) < 0.02
    staleness = [v for _, v in want["rollout/staleness/max"]]
    assert staleness == ([0.0] * N if mode == "off" else [0.0] + [1.0] * (N - 1))


def test_sigkill_before_the_first_checkpoint_reattaches_the_run(tmp_path, tiny_model_dir):
    """Killed after rollout 0 was logged but before any checkpoint, the MLflow run stays RUNNING; the rerun starts
    from rollout 0 again in that same run (named in mlflow_run.json), not a second one, and logs no step twice
    (issue 19 #4)."""
    env = {**os.environ, "COLUMNS": "120"}
    run_dir = tmp_path / "run"
    # three rollouts, the only checkpoint after the last: the kill at rollout 1 has a whole rollout of slack before it
    cmd = [*_cli(run_dir, "off", "tiny", "torch"), "--num-rollout", "3", "--save-interval", "5"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    second, deadline = run_dir / "rollouts" / "1.pt", time.time() + 600
    while time.time() < deadline and not second.exists():  # rollout 1 is generated after rollout 0 is trained and logged
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (run_dir / "checkpoints" / "latest").exists()
    status, before = _metrics(run_dir)
    assert status == "RUNNING"  # metrics reach the store asynchronously: rollout 0's, or none yet
    assert [s for s, _ in before.get("rollout/raw_reward", [])] in ([], [0])

    rerun = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    status, got = _metrics(run_dir)  # _metrics unpacks exactly one run of the experiment
    assert status == "FINISHED"
    for key, points in got.items():
        steps = [s for s, _ in points]
        assert len(steps) == len(set(steps)), f"duplicate steps in {key}: {steps}"
    assert [s for s, _ in got["rollout/raw_reward"]] == [0, 1, 2]
    for step in before.get("rollout/raw_reward", []):
        assert step in got["rollout/raw_reward"]  # the rollouts redone gave the same numbers

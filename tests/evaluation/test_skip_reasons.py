"""Every built-in skip reason, each produced by its real condition (never by calling a logger), and
a custom reason raised by an eval function (eval_function_path)."""

from __future__ import annotations

import socket
import threading
from dataclasses import replace

import pytest

from miles_core.checkpoint import export_hf
from miles_core.evaluation import EvalPoint, EvalSkip, SnapshotEvaluator, load_hf_engine, run_point
from miles_core.evaluation.suite import resolve_eval_fn


def crash_eval(request):
    raise RuntimeError("the judge model is out of memory")


def no_judge_eval(request):
    raise EvalSkip("no_judge", "the judge endpoint is not configured")


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_complete_snapshot_is_evaluated(snapshot, suite):
    r = run_point(EvalPoint(5, snapshot), suite, load_hf_engine)
    assert not r.skipped, r.detail
    assert r.metrics["eval/arith/weight_version/mean"] == 5 and r.metrics["eval/duration_seconds"] > 0


def test_ckpt_missing_snapshot_without_complete_marker(snapshot, suite):
    (snapshot / ".complete").unlink()  # an interrupted export: files there, marker not
    assert run_point(EvalPoint(5, snapshot), suite, load_hf_engine).reason == "ckpt_missing"


def test_ckpt_missing_truncated_checkpoint(tmp_path, tiny_model, suite):
    from miles_core.checkpoint import save_checkpoint

    save_checkpoint(tmp_path / "ckpt", 0, model=tiny_model, state={"weight_version": 1})
    weights = tmp_path / "ckpt" / "0" / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # a truncated file: the manifest size no longer matches
    assert run_point(EvalPoint(2, tmp_path / "ckpt" / "0", "checkpoint"), suite, load_hf_engine).reason == "ckpt_missing"


def test_export_failed_when_the_snapshot_dir_cannot_be_written(tmp_path, tiny_model, tiny_tokenizer, suite):
    blocked = tmp_path / "eval_snapshots"
    blocked.write_text("a file where the snapshot dir should go")
    ev = SnapshotEvaluator(suite, blocked, lambda root, v: export_hf(tiny_model, tiny_tokenizer, root, v), load_hf_engine)
    r = ev.submit(3)
    ev.close()
    assert r.reason == "export_failed" and "eval_snapshots" in r.detail


def test_crashed_when_the_eval_function_raises(snapshot, suite):
    crashing = replace(suite, eval_fn=resolve_eval_fn(f"{__name__}:crash_eval"))
    r = run_point(EvalPoint(5, snapshot), crashing, load_hf_engine)
    assert r.reason == "crashed" and "out of memory" in r.detail


def test_crashed_when_the_engine_cannot_load(snapshot, suite):
    (snapshot / "config.json").write_text("{" + " " * (len((snapshot / "config.json").read_text()) - 1))  # same size, not JSON
    assert run_point(EvalPoint(5, snapshot), suite, load_hf_engine).reason == "crashed"


def test_custom_reason_from_eval_function(snapshot, suite):
    r = run_point(EvalPoint(5, snapshot), replace(suite, eval_fn=resolve_eval_fn(f"{__name__}.no_judge_eval")), load_hf_engine)
    assert r.reason == "no_judge" and r.metrics == {"eval/skipped_no_judge": 1.0}
    with pytest.raises(ValueError, match="a-z0-9_"):
        EvalSkip("No Judge!")


def test_unhealthy_when_the_eval_engine_is_unreachable(snapshot, suite):
    from miles_core.rollout.http import HTTPEngineClient

    url = f"http://127.0.0.1:{_closed_port()}"  # an SGLang-protocol engine that is down
    r = run_point(EvalPoint(5, snapshot), suite, lambda path, v: HTTPEngineClient(url, max_retries=0, health_timeout_s=1))
    assert r.reason == "unhealthy" and url in r.detail


def test_pin_violation_when_the_engine_serves_another_version(snapshot, suite):
    def stale_engine(path, version):  # loaded the weights, but never took the new version (a failed version update)
        return load_hf_engine(path, version - 1)

    r = run_point(EvalPoint(5, snapshot), suite, stale_engine)
    assert r.reason == "pin_violation" and "weight version 4" in r.detail


def test_pin_violation_when_the_version_moves_during_the_eval(snapshot, suite):
    def moving_engine(path, version):  # a weight update lands mid-eval: later samples carry version + 1
        engine = load_hf_engine(path, version)
        generate = engine.generate

        def gen(requests, seed):
            out = generate(requests, seed)
            engine.set_weight_version(version + 1)
            return out

        engine.generate = gen
        return engine

    assert run_point(EvalPoint(5, snapshot), suite, moving_engine).reason == "pin_violation"


def _blocking_evaluator(tmp_path, model, tokenizer, suite, policy):
    release, started = threading.Event(), threading.Event()

    def slow_engine(path, version):  # the first eval holds its slot until released
        started.set()
        assert release.wait(60)
        return load_hf_engine(path, version)

    ev = SnapshotEvaluator(suite, tmp_path / "snaps", lambda root, v: export_hf(model, tokenizer, root, v), slow_engine,
                           max_in_flight=1, policy=policy, keep=1)
    return ev, release, started


def test_busy_when_max_in_flight_reached_with_policy_skip(tmp_path, tiny_model, tiny_tokenizer, suite):
    ev, release, started = _blocking_evaluator(tmp_path, tiny_model, tiny_tokenizer, suite, "skip")
    assert ev.submit(1) is None
    assert started.wait(60)
    busy = ev.submit(2)
    release.set()
    results = ev.collect(wait_all=True)
    ev.close()
    assert busy.reason == "busy" and busy.metrics == {"eval/skipped_busy": 1.0}
    assert [r.step for r in results] == [1] and not results[0].skipped
    assert results[0].metrics["eval/export_time_seconds"] > 0
    assert not (tmp_path / "snaps" / "2").exists()  # a skipped point is never exported


def test_backpressure_waits_and_retention_keeps_newest(tmp_path, tiny_model, tiny_tokenizer, suite):
    ev, release, started = _blocking_evaluator(tmp_path, tiny_model, tiny_tokenizer, suite, "backpressure")
    assert ev.submit(1) is None
    assert started.wait(60)
    threading.Timer(0.5, release.set).start()
    assert ev.submit(2) is None  # waited for eval 1 to finish instead of skipping
    results = ev.collect(wait_all=True)
    ev.close()
    assert [(r.step, r.skipped) for r in results] == [(1, False), (2, False)]
    assert sorted(p.name for p in (tmp_path / "snaps").iterdir()) == ["2"]  # eval_keep_snapshots 1


def test_eval_hf_dir_stages_the_runs_snapshots(tmp_path, tiny_model, tiny_tokenizer, suite):
    """The reference's --eval-hf-dir (miles/ray/rollout/eval_dispatch.py): the runtime's snapshot evals export into
    <eval_hf_dir>/<version>/ (default <run_dir>/eval_snapshots) and evaluate from there; refused with inline eval."""
    from flows.recipes import load_config
    from miles_core.config import ConfigError
    from miles_core.runtime.runtime import Runtime, RunData

    class Exporter:  # the trainer's export: the tiny model as an HF snapshot
        def export(self, root, version, tokenizer):
            return export_hf(tiny_model, tokenizer, root, version)

    def snapshot_evals(**over):
        rt = Runtime.__new__(Runtime)
        rt.cfg = load_config("tiny", {"eval_mode": "snapshot", "run_dir": str(tmp_path / "run"), **over})
        rt.data = RunData(model_path=tmp_path, tokenizer=tiny_tokenizer, source=None, num_prompts=0, dropped_prompts=0,
                          context_len=None, eval_suite=suite, params=None, rewards=None)
        rt.trainer, rt.weight_version, rt._snapshot_evals = Exporter(), 3, None
        rt._offloads_trainer = rt._trainer_offloaded = False  # Runtime.__init__ sets them (offload_train)
        return rt.snapshot_evals()

    assert snapshot_evals().root == tmp_path / "run" / "eval_snapshots"
    ev = snapshot_evals(eval_hf_dir=str(tmp_path / "staging"))
    try:
        assert ev.submit(3) is None
        [result] = ev.collect(wait_all=True)
    finally:
        ev.close()
    assert not result.skipped and (tmp_path / "staging" / "3" / ".complete").is_file()
    assert not (tmp_path / "run" / "eval_snapshots").exists()
    with pytest.raises(ConfigError, match="eval_hf_dir stages the HF snapshots of eval_mode snapshot"):
        load_config("tiny", {"eval_hf_dir": str(tmp_path / "staging")})


EVAL_LOGS: list[tuple] = []


def log_eval_and_skip(rollout_id, args, data, extra_metrics):
    EVAL_LOGS.append((rollout_id, args.n_samples_per_eval_prompt, {k: (len(v["rewards"]), len(v["truncated"]), len(v["samples"]))
                                                                   for k, v in data.items()}, extra_metrics))
    return data["arith"]["samples"][0].reward is not None  # True: drop the eval's metrics


def log_eval_and_keep(rollout_id, args, data, extra_metrics):
    EVAL_LOGS.append((rollout_id,))
    return False


def test_custom_eval_rollout_log_function_gets_the_eval_data_and_its_true_drops_the_metrics(snapshot, tiny_cfg, tiny_tokenizer):
    """The reference's log_eval_rollout_data (miles/ray/rollout/metrics.py): custom_eval_rollout_log_function_path is
    called as fn(rollout_id, args, data, extra_metrics) with each dataset's rewards, truncated flags and scored samples;
    True: no eval/<ds> metrics; False: the usual ones. rollout_id: the point's (0 when unknown, before training)."""
    from miles_core.evaluation import build_suite

    def run(fn, rollout_id):
        cfg = tiny_cfg.model_copy(update={"rollout": tiny_cfg.rollout.model_copy(
            update={"custom_eval_rollout_log_function_path": f"{__name__}.{fn}"})})
        return run_point(EvalPoint(5, snapshot, rollout_id=rollout_id), build_suite(cfg, tiny_tokenizer), load_hf_engine)

    EVAL_LOGS.clear()
    skipped = run("log_eval_and_skip", 3)
    assert EVAL_LOGS == [(3, 2, {"arith": (8, 8, 8)}, None)]
    assert not skipped.skipped and not any(k.startswith("eval/arith") for k in skipped.metrics) and skipped.rows
    EVAL_LOGS.clear()
    kept = run("log_eval_and_keep", None)
    assert EVAL_LOGS == [(0,)] and "eval/arith" in kept.metrics

"""The event logger on the local runtime (save_debug_event_data, save_local_weight_checksum, enable_event_analyzer):
the stages of a tiny run write typed events that parse and cover its milestones; the trainer's digests of what it sent
equal the in-process engine's of what it holds; an engine weight corrupted on its way fails the next train step naming
the tensor and the weight version; a resume puts the checkpoint's event dir back. Stages called in the train flow's
order (flows/train.py), as tests/runtime/test_local_resume.py."""

from __future__ import annotations

import json

import pytest
import torch

from flows.recipes import load_config
from miles_core.runtime.event_analyzer import EventAnalysisError
from miles_core.runtime.events import read_events, snapshot_dir
from miles_core.runtime.placement import build_runtime

BASE = {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "rollout_max_response_len": 4, "rm_type": "deterministic_random",
        "num_threads": 1, "num_rollout": 3, "eval_prompt_data": None}
CHECKED = {"save_local_weight_checksum": True, "enable_event_analyzer": True}


def _cfg(tmp_path, **over):
    run = tmp_path / "run"
    return load_config("tiny", {**BASE, "run_dir": str(run), "save_debug_event_data": str(run / "events"), **over})


class Corrupting:
    """The trainer's weights with one tensor changed on its way to the engine (the trainer's digests are of its own)."""

    def __init__(self, inner, name: str):
        self.inner, self.name = inner, name

    def tensors(self):
        return [(n, t + 1 if n == self.name else t) for n, t in self.inner.tensors()]

    def checksums(self):
        return self.inner.checksums()


def _types(event_dir) -> list[str]:
    return [e.type for e in read_events(event_dir)]


def test_a_run_writes_its_milestones_and_the_engine_holds_what_the_trainer_sent(tmp_path):
    cfg = _cfg(tmp_path, **CHECKED)
    rt = build_runtime(cfg)
    try:
        rt.sync_weights()
        rt.generate(0), rt.train(0), rt.save(0, {}), rt.sync_weights()
        rt.finish_checks()  # the analyzer finds nothing
    finally:
        rt.close()
    event_dir = cfg.run_dir / "events"
    assert sorted(p.name for p in event_dir.iterdir()) == ["actor_cell0_rank0.jsonl", "main.jsonl"]  # one file per process
    for line in (event_dir / "main.jsonl").read_text().splitlines():
        assert json.loads(line)["source"] == {"component": "main", "cell_index": 0, "rank_within_cell": 0}
    events = read_events(event_dir)
    assert set(_types(event_dir)) == {"weight_sync", "rollout_generated", "metric", "train_step_end", "checkpoint_saved",
                                      "train_engine_local_weight_checksum", "inference_engine_weight_checksum"}
    syncs = [(e.rollout_id, e.weight_version) for e in events if e.type == "weight_sync"]
    assert syncs == [(None, 1), (0, 2)]  # before rollout 0, after rollout 0
    sent = {e.weight_version: e.param_hashes for e in events if e.type == "train_engine_local_weight_checksum"}
    held = {e.weight_version: e.engine_checksums for e in events if e.type == "inference_engine_weight_checksum"}
    assert sent[1] != sent[2]  # the train step changed the weights
    params = dict(rt.engine.model.state_dict())
    assert set(sent[2]) == set(params) and held == {v: [sent[v]] for v in (1, 2)}
    (metric,) = [e for e in events if e.type == "metric" and "rollout/raw_reward" in e.metrics]
    assert metric.rollout_id == 0
    assert (snapshot_dir(cfg.save_dir, 0) / "main.jsonl").is_file()  # the checkpoint's snapshot of the event dir


def test_a_corrupted_engine_weight_fails_the_next_train_step_naming_the_tensor(tmp_path):
    rt = build_runtime(_cfg(tmp_path, **CHECKED))
    try:
        name = next(n for n, _ in rt.weights.tensors() if n.endswith("layers.1.mlp.down_proj.weight"))
        rt.weights = Corrupting(rt.weights, name)
        rt.sync_weights()
        assert torch.equal(dict(rt.engine.model.named_parameters())[name],
                           dict(rt.trainer.named_tensors())[name] + 1)  # the engine holds the corrupted tensor
        rt.generate(0)
        with pytest.raises(EventAnalysisError, match=f"1 weight checksum mismatches .*tensor '{name}' at weight version 1: "
                                                     "trainer sent [0-9a-f]+ != engine 0 holds"):
            rt.train(0)
    finally:
        rt.close()


def test_without_the_analyzer_the_mismatch_is_recorded_not_raised(tmp_path):
    from miles_core.runtime.event_analyzer import run_analysis

    cfg = _cfg(tmp_path, save_local_weight_checksum=True)
    rt = build_runtime(cfg)
    try:
        rt.weights = Corrupting(rt.weights, "model.norm.weight")
        rt.sync_weights()
        rt.finish_checks()
    finally:
        rt.close()
    assert [(i.key, i.weight_version) for i in run_analysis(cfg.run_dir / "events")] == [("model.norm.weight", 1)]


def test_a_resume_restores_the_event_dir_of_its_checkpoint(tmp_path):
    cfg = _cfg(tmp_path)
    first = build_runtime(cfg)
    try:
        first.sync_weights()
        first.generate(0), first.train(0), first.save(0, {}), first.sync_weights()
        first.generate(1)  # after the checkpoint: not part of it
    finally:
        first.close()
    event_dir = cfg.run_dir / "events"
    assert _types(event_dir)[-2:] == ["rollout_generated", "metric"]
    again = build_runtime(cfg)  # as after a kill
    try:
        meta = again.restore()
    finally:
        again.close()
    assert meta["rollout_id"] == 0
    kept = _types(event_dir)
    assert kept[:7] == ["weight_sync", "rollout_generated", "metric", "train_step_end", "metric", "checkpoint_saved",
                        "checkpoint_restored"] and kept[7:] == ["weight_sync"]  # the restore's own sync follows
    assert [p.name for p in event_dir.parent.iterdir() if p.name.startswith(".trash_")]  # the dir it replaced, moved aside


def test_dump_details_writes_events_under_it(tmp_path):
    cfg = load_config("tiny", {**BASE, "run_dir": str(tmp_path / "run"), "dump_details": str(tmp_path / "dump")})
    assert cfg.misc.event_dir == f"{tmp_path / 'dump'}/events"


@pytest.mark.parametrize("over, match", [
    ({"save_local_weight_checksum": True}, "save_local_weight_checksum write and read the run's events: set save_debug_event_data"),
    ({"enable_event_analyzer": True}, "enable_event_analyzer write and read the run's events: set save_debug_event_data"),
    ({"save_debug_event_data": "ev", "dump_details": "d"}, "dump_details sets save_debug_event_data itself"),
    ({"save_debug_event_data": "ev", "save_local_weight_checksum": True, "debug_rollout_only": True},
     "save_local_weight_checksum records each weight sync"),
    ({"save_debug_event_data": "ev", "save_local_weight_checksum": True, "rollout_engine": "sglang", "runtime": "ray"},
     "save_local_weight_checksum with rollout_engine sglang is not supported yet"),
    ({"save_debug_event_data": "ev", "save_local_weight_checksum": True, "lora_rank": 4, "target_modules": "all-linear", "lora_sync_from_tensor": True},
     "save_local_weight_checksum with lora_sync_from_tensor is not supported yet"),
    ({"env_report": "not json"}, "env_report 'not json' is neither a JSON object nor base64 of one"),
])
def test_event_options_are_checked_at_load_naming_the_field(over, match):
    with pytest.raises(ValueError, match=match):
        load_config("tiny", {**BASE, **over})


def test_snapshots_of_checkpoints_retention_removed_are_dropped(tmp_path):
    from miles_core.checkpoint.load import list_checkpoints
    from miles_core.runtime.events import EventLog, MAIN, WeightSyncEvent, prune_snapshots, snapshot

    EventLog(tmp_path / "events").log(WeightSyncEvent, MAIN, rollout_id=None, weight_version=1)
    for i in (0, 1, 2):
        assert (snapshot(tmp_path / "events", tmp_path / "save", i) / "main.jsonl").is_file()
    prune_snapshots(tmp_path / "save", {2})
    assert sorted(p.name for p in (tmp_path / "save" / "debug_events").iterdir()) == ["2"]
    assert list_checkpoints(tmp_path / "save") == []  # debug_events/ is no checkpoint dir

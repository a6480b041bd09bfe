"""Contract of each weight sync mode (tensor, broadcast, disk, disk-delta) against real HTTP engine servers on
127.0.0.1 (in-thread servers; the broadcast group is a real gloo group): afterwards every engine
holds the trainer's weights bit for bit, reports the new version, and generates exactly what an
in-process engine with the same weights generates. Also: release/resume of engine memory."""

from __future__ import annotations

import json

import pytest
import torch

from miles_core.rollout.hf_engine import HFEngine
from miles_core.rollout.http import EngineRouter, HFEngine, serve_in_thread
from miles_core.rollout.protocol import GenerateRequest, SamplingParams
from miles_core.weights.delta import INDEX
from miles_core.weights.sync import MODES, DeltaOptions, WeightSender, WeightSync, iter_buckets, iter_meta_buckets

BUCKET = 64 * 1024  # several buckets for the tiny model (~3M params, 12 MB)


@pytest.fixture
def servers(tiny_model_dir):
    """Two engines of TP 2 (each takes 2 ranks of a broadcast group, as SGLang's TP workers do)."""
    handles = [serve_in_thread(HFEngine.from_pretrained(tiny_model_dir, batching="exact"), model_path=str(tiny_model_dir),
                               tp_size=2) for _ in range(2)]
    yield handles
    for h in handles:
        h.stop()


def _requests(tok) -> list[GenerateRequest]:
    sp = SamplingParams(max_new_tokens=6, stop_token_ids=(tok.eos_token_id,))
    return [GenerateRequest(tok(f"{i}+{i}=")["input_ids"], sp) for i in range(6)]


def _assert_engines_hold(servers, model, version: int) -> None:
    want = model.state_dict()
    for h in servers:
        got = h.server.engine.model.state_dict()
        assert set(got) == set(want)
        assert all(torch.equal(got[k], want[k]) for k in want), [k for k in want if not torch.equal(got[k], want[k])][:3]
        assert h.server.engine.weight_version == version


def test_meta_buckets_match_tensor_buckets(trainer_model):
    named = list(trainer_model.state_dict().items())
    sender = WeightSender(lambda: named)
    names, dtypes, shapes = sender.meta()
    by_meta = [[names[i] for i in r] for r in iter_meta_buckets(names, dtypes, shapes, BUCKET)]
    by_tensor = [[n for n, _ in b] for b in iter_buckets(named, BUCKET)]
    assert by_meta == by_tensor and len(by_meta) > 3


@pytest.mark.parametrize("mode", MODES)
def test_mode_contract(mode, servers, trainer_model, tiny_tokenizer, tmp_path):
    """Also SGLang's ranks with TP > 1 (finding 4 of issue 27): engine j's ranks are 1 + the TP sizes before it (+ tp
    rank), world 1 + the sum of TP sizes: offsets 1 and 3, world 5; every group rank receives every tensor whole."""
    sender = WeightSender(lambda: trainer_model.state_dict().items(), trainer_model.config)
    delta = DeltaOptions(str(tmp_path / "deltas"), str(tmp_path / "local")) if mode == "disk-delta" else None
    sync = WeightSync(mode, BUCKET, disk_dir=tmp_path / "weight_sync", delta=delta)  # disk-delta: one local dir for both
    with EngineRouter.from_urls([h.url for h in servers], bucket_bytes=BUCKET) as router:
        assert router.group_ranks(router.weight_targets()) == ([1, 3], 5)
        for version in (1, 2):  # the second sync reuses the broadcast group
            with torch.no_grad():
                trainer_model.model.norm.weight.mul_(1.01)  # a trainer step between syncs
            metrics = sync.sync(sender, router, version)
            assert metrics["perf/update_weights_time"] > 0
            _assert_engines_hold(servers, trainer_model, version)
            assert router.engine_versions() == {h.url: version for h in servers}
        name = "model.layers.0.mlp.up_proj.weight"
        assert torch.equal(router.slots[0].client.get_weights_by_name(name), trainer_model.state_dict()[name])
        reqs = _requests(tiny_tokenizer)
        local = HFEngine(trainer_model, tiny_tokenizer, batching="exact")
        local.set_weight_version(2)
        key = lambda r: (r.output_ids, r.output_log_probs, r.finish_reason, r.weight_version)  # noqa: E731
        assert [key(r) for r in router.generate(reqs, 7)] == [key(r) for r in local.generate(reqs, 7)]
    groups = [e.rsplit(":", 1)[-1] for h in servers for e in h.server.events if e.startswith("group:")]
    assert groups == (["1+2/5", "3+2/5"] if mode == "broadcast" else [])  # one group, made by the first sync
    n = 2 * len(trainer_model.state_dict()) if mode == "broadcast" else 0  # two syncs; SGLang's layout: every rank, whole
    assert [h.server.received for h in servers] == ([{1: n, 2: n}, {3: n, 4: n}] if n else [{}, {}])
    sessions = [e for e in servers[0].server.events if e.endswith("weight_update")]
    assert sessions == ([] if mode.startswith("disk") else ["begin_weight_update", "end_weight_update"] * 2)  # disk: none
    if mode == "broadcast":
        assert sync._groups == 1
        assert all(h.server.stats["weight_buckets"] > 3 for h in servers)
    if mode == "disk":
        assert [p.name for p in (tmp_path / "weight_sync").iterdir()] == ["v2"]  # older versions removed, no temp dirs
        assert (tmp_path / "weight_sync" / "v2" / "config.json").exists()
    if mode == "disk-delta":  # a full version, then a delta of the one changed tensor; both engines pulled each
        assert sorted(p.name for p in (tmp_path / "deltas").iterdir()) == ["weight_v000001", "weight_v000002"]
        assert list(json.loads((tmp_path / "deltas" / "weight_v000002" / INDEX).read_text())["weight_map"]) == ["model.norm.weight"]
        assert [[e for e in h.server.events if e == "pull_weights"] for h in servers] == [["pull_weights"] * 2] * 2
    sync.close()


def test_release_resume_then_sync(servers, trainer_model, tiny_tokenizer):
    """Colocated offload on CPU: released weights are dropped; generate refuses until resumed and every
    parameter rewritten by a sync; then results are those of the trainer's weights."""
    from miles_core.rollout.http import EngineHTTPError

    sender = WeightSender(lambda: trainer_model.state_dict().items())
    sync = WeightSync("tensor", BUCKET)
    reqs = _requests(tiny_tokenizer)
    with EngineRouter.from_urls([servers[0].url], bucket_bytes=BUCKET) as router:
        client = router.slots[0].client
        router.release_memory_occupation(["weights", "kv_cache", "cuda_graph"])
        assert all(p.numel() == 0 for p in servers[0].server.engine.model.parameters())  # dropped
        with pytest.raises(EngineHTTPError, match="released"):
            client.generate(reqs, 1)
        router.resume_memory_occupation(["weights"])
        assert len(servers[0].server._stale) == len(list(trainer_model.parameters()))  # allocated, not yet written
        with pytest.raises(EngineHTTPError, match="503"):
            client.generate(reqs, 1)
        sync.sync(sender, router, 1)
        router.resume_memory_occupation(["kv_cache", "cuda_graph"])
        _assert_engines_hold(servers[:1], trainer_model, 1)
        local = HFEngine(trainer_model, tiny_tokenizer, batching="exact")
        assert [r.output_ids for r in router.generate(reqs, 3)] == [r.output_ids for r in local.generate(reqs, 3)]
        events = client.server_info()["events"]
        assert events[0] == "release:cuda_graph,kv_cache,weights" and events[1] == "resume:weights"
        assert events[2:4] == ["pause:retract", "flush_cache"]  # WeightSync's default pause mode
        events = events[2:]
        assert events[2] == "begin_weight_update" and events[3].startswith("weights:")  # buckets inside the session
        assert events[-3:] == ["end_weight_update", "version:1", "resume:cuda_graph,kv_cache"]


def test_a_failed_sync_resumes_the_engines_and_keeps_their_version():
    """A bucket that fails half-way: generation continues (not left paused), the version is not bumped."""
    from miles_core.weights.sync import sync_weights

    class Engine:
        def __init__(self):
            self.version, self.events = 0, []

        def pause_generation(self):
            self.events.append("pause")

        def continue_generation(self):
            self.events.append("continue")

        def flush_cache(self):
            self.events.append("flush")

        def set_weight_version(self, v):
            self.version = v

        def begin_weight_update(self):
            self.events.append("begin")

        def end_weight_update(self):
            self.events.append("end")

        def update_weights_from_tensor(self, bucket):
            raise ConnectionError("engine went away mid-sync")

    e = Engine()
    with pytest.raises(ConnectionError):
        sync_weights([("w", torch.zeros(2))], [e], version=5, max_bytes=1024)
    assert e.events == ["pause", "flush", "begin", "end", "continue"] and e.version == 0


@pytest.mark.parametrize("pause_mode", ["abort", "retract", "in_place"])
def test_pause_generation_mode_is_sent_to_every_engine_and_in_place_skips_the_flush(pause_mode, servers, trainer_model):
    """pause_generation_mode: each engine's /pause_generation carries it; in_place keeps the KV cache, so no
    /flush_cache follows (the reference's _pause_and_prepare_engines); the modes are SGLang 0.5.23's."""
    import typing

    from miles_core.config import RolloutConfig
    from miles_core.rollout.sglang.protocol import protocol
    from miles_core.weights.sync import PAUSE_MODES

    sglang_modes = protocol()["requests"]["PauseGenerationReqInput"]["mode"]["type"]  # "Literal['abort', 'retract', ...]"
    assert sglang_modes == "Literal[" + ", ".join(repr(m) for m in PAUSE_MODES) + "]"
    assert typing.get_args(RolloutConfig.model_fields["pause_generation_mode"].annotation) == PAUSE_MODES
    sender = WeightSender(lambda: trainer_model.state_dict().items())
    sync = WeightSync("tensor", BUCKET, pause_mode=pause_mode)
    with EngineRouter.from_urls([h.url for h in servers], bucket_bytes=BUCKET) as router:
        sync.sync(sender, router, 1)
    for h in servers:
        control = [e for e in h.server.events if e.startswith("pause") or e == "flush_cache"]
        assert control == [f"pause:{pause_mode}"] + ([] if pause_mode == "in_place" else ["flush_cache"])
    with pytest.raises(ValueError, match="pause mode 'stop'"):
        WeightSync("tensor", BUCKET, pause_mode="stop")
    sync.close()


@pytest.mark.parametrize(("level", "released"), [(["kv_cache", "weight"], "cuda_graph,kv_cache,weights"),
                                                 (["kv_cache"], "cuda_graph,kv_cache")])
def test_offload_rollout_level_picks_the_memory_the_engines_release(level, released, servers, trainer_model, tmp_path):
    """offload_rollout_level: the train stage releases cuda_graph plus these tags (the reference's train.py), the sync
    resumes exactly them, weights first; kept weights are not dropped."""
    from miles_core.config import ConfigError, build_config
    from miles_core.rollout.http import HTTPFleet

    base = {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "prompt_data": "builtin://arith", "runtime": "ray"}
    cfg = build_config({**base, "offload_rollout": True, "offload_rollout_level": level, "run_dir": str(tmp_path)})
    assert build_config({**base, "colocate": True}).cluster.rollout_offload_tags == ["cuda_graph", "kv_cache", "weights"]
    assert build_config(base).cluster.rollout_offload_tags == []  # default: offload follows colocate
    with pytest.raises(ConfigError, match="offload_rollout.*local runtime"):
        build_config({**base, "runtime": "local", "offload_rollout": True})
    with pytest.raises(ConfigError, match="async_mode one_step generates then"):
        build_config({**base, "offload_rollout": True, "async_mode": "one_step"})
    router = EngineRouter.from_urls([servers[0].url], bucket_bytes=BUCKET)
    fleet = HTTPFleet(router, WeightSync("tensor", BUCKET), offload_tags=cfg.cluster.rollout_offload_tags)
    try:
        fleet.before_train()
        engine = servers[0].server
        assert engine.released == set(released.split(","))
        assert all(p.numel() > 0 for p in engine.engine.model.parameters()) == ("weights" not in released)
        fleet.update_weights(WeightSender(lambda: trainer_model.state_dict().items()), 1)
        memory = [e for e in engine.events if e.startswith(("release", "resume"))]
        resumed = ["resume:weights", "resume:cuda_graph,kv_cache"] if "weights" in released else ["resume:cuda_graph,kv_cache"]
        assert memory == [f"release:{released}", *resumed] and not engine.released
        _assert_engines_hold(servers[:1], trainer_model, 1)
    finally:
        fleet.close()

"""disk-delta weight sync (miles_core/weights/delta.py): the trainer publishes what changed since the last sync, the
engine verifies and applies it into its local checkpoint and reloads from it. Real torch training between syncs, real
HTTP engine servers on 127.0.0.1, the formats of the reference (update_weight_from_distributed/delta.py,
utils/disk_delta.py) and of SGLang's pull (srt/weight_sync/local_checkpoint.py)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from miles_core.rollout.fleet import InProcessFleet
from miles_core.rollout.hf_engine import HFEngine
from miles_core.rollout.http import EngineRouter, serve_in_thread
from miles_core.weights.delta import (CHECKSUMS, DELTA_FILE, ENCODINGS, INDEX, DeltaError, DeltaPublisher, checksum,
                                      decode, encode, pull, read_state, version_dir, zstd_compress, zstd_content_size,
                                      zstd_decompress)
from miles_core.weights.sync import DeltaOptions, WeightSender, WeightSync, WeightSyncError

HOOK_CALLS: list[tuple] = []


def post_write(args, version_dir, rollout_engines):  # the reference's signature (arguments.py, disk-delta's hook)
    """What the engines will read must be there when the hook runs: record it."""
    HOOK_CALLS.append((args, version_dir, rollout_engines, sorted(p.name for p in Path(version_dir).iterdir())))


class Source:
    """The trainer's side, as the local runtime's LocalWeights is."""

    def __init__(self, model):
        self.model = model

    def tensors(self):
        return self.model.state_dict().items()


def _train_step(model, opt, tok) -> None:
    """One real optimizer step (AdamW touches every parameter)."""
    ids = torch.tensor([tok("12+34=46")["input_ids"]])
    loss = model(input_ids=ids, labels=ids).loss
    opt.zero_grad()
    loss.backward()
    opt.step()


def _holds(engine_model, model) -> list[str]:
    want, got = model.state_dict(), engine_model.state_dict()
    return [k for k in want if not torch.equal(got[k], want[k])]


# ---- the format --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_encodings_are_exact_and_byte_level(encoding, dtype):
    g = torch.Generator().manual_seed(0)
    old_t = torch.randn(64, generator=g).to(dtype)
    new_t = old_t.clone()
    new_t[[3, 40]] += 1.0  # two elements change
    old, new = (t.view(torch.uint8).numpy().copy() for t in (old_t, new_t))
    diff, changed = encode(new, old, encoding)
    size = dtype.itemsize
    assert 1 <= changed <= 2 * size  # at most the bytes of the two elements
    assert diff.size == (old.size if encoding == "xor" else 4 + 5 * changed)  # xor: one byte each; overwrite: u4 + u4 + u1
    back = decode(old, zstd_decompress(zstd_compress(diff).tobytes()), encoding)
    assert np.array_equal(back, new) and np.array_equal(old, old_t.view(torch.uint8).numpy())  # old untouched
    assert encode(old, old, encoding) == (None, 0)


def test_zstd_frames_carry_their_size_and_checksums_are_the_reference_digests():
    for n in (0, 7, 255, 256, 70_000):  # each Frame_Content_Size field width
        data = (np.arange(n) % 251).astype(np.uint8)
        frame = zstd_compress(data).tobytes()
        assert zstd_content_size(frame) == n and np.array_equal(zstd_decompress(frame), data)
    import xxhash

    assert checksum("adler32", b"abc") == f"{zlib.adler32(b'abc'):08x}" == "024d0127"
    assert checksum("xxh3-128", b"abc") == xxhash.xxh3_128(b"abc").hexdigest() and len(checksum("xxh3-128", b"")) == 32
    assert CHECKSUMS == ("xxh3-128", "adler32")


def test_publish_writes_a_full_version_then_canonical_deltas(tmp_path, trainer_model):
    (tmp_path / "pub" / "weight_v000009").mkdir(parents=True)  # an earlier run's version: cleared at the first publish
    pub = DeltaPublisher(tmp_path / "pub", "overwrite", "adler32")
    first = pub.publish(trainer_model.state_dict().items(), 3, trainer_model.config)
    assert first.full and sorted(p.name for p in (tmp_path / "pub").iterdir()) == ["weight_v000003"]
    full = version_dir(tmp_path / "pub", 3)
    assert {"model.safetensors", INDEX, "config.json"} <= {p.name for p in full.iterdir()}  # an HF dir SGLang reloads
    assert "delta_encoding" not in json.loads((full / INDEX).read_text())["metadata"]  # SGLang's test for a full version
    before = trainer_model.model.norm.weight.detach().view(torch.uint8).numpy().copy()
    with torch.no_grad():
        trainer_model.model.norm.weight.add_(0.5)
    second = pub.publish(trainer_model.state_dict().items(), 4)
    index = json.loads((version_dir(tmp_path / "pub", 4) / INDEX).read_text())
    meta = index["metadata"]
    assert {k: meta[k] for k in ("version", "base_version", "delta_encoding", "compression_format", "checksum_format")} == {
        "version": "000004", "base_version": "000003", "delta_encoding": "overwrite", "compression_format": "zstd",
        "checksum_format": "adler32"}
    assert index["weight_map"] == {"model.norm.weight": DELTA_FILE}
    sums = _header(version_dir(tmp_path / "pub", 4) / DELTA_FILE)["__metadata__"]
    assert sums == {"model.norm.weight": checksum("adler32", trainer_model.model.norm.weight.detach().view(torch.uint8).numpy())}
    total = sum(t.numel() * t.element_size() for t in trainer_model.state_dict().values())
    after = trainer_model.model.norm.weight.detach().view(torch.uint8).numpy()
    assert second.density == np.count_nonzero(before != after) / total  # the changed bytes over all bytes
    assert 0 < second.wire_bytes < first.wire_bytes / 100
    assert pub.publish(trainer_model.state_dict().items(), 4) == second  # a resync of the same version publishes nothing


# ---- the in-process engine -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_in_process_engine_equals_the_trainer_after_each_delta_sync(encoding, tmp_path, tiny_model_dir, trainer_model,
                                                                     tiny_tokenizer):
    """N syncs with real AdamW steps between them: after each, the engine's weights are the trainer's bit for bit (both
    encodings are exact), it serves the version, and the hook ran with (args, version_dir, rollout_engines) once the
    version's files were there."""
    engine = HFEngine.from_pretrained(tiny_model_dir, tokenizer=tiny_tokenizer)
    HOOK_CALLS.clear()
    args = object()
    options = DeltaOptions(str(tmp_path / "pub"), str(tmp_path / "local"), encoding, "xxh3-128", hook=post_write, hook_args=args)
    fleet = InProcessFleet(engine, 1 << 20, delta=options)
    opt = torch.optim.AdamW(trainer_model.parameters(), lr=1e-3)
    densities = []
    for version in range(1, 5):
        if version > 1:
            _train_step(trainer_model, opt, tiny_tokenizer)
        metrics = fleet.update_weights(Source(trainer_model), version)
        densities.append(metrics["perf/update_weights_density"])
        assert _holds(engine.model, trainer_model) == [] and engine.get_weight_version() == version
        assert read_state(tmp_path / "local")[0] == version
    assert [c[1] for c in HOOK_CALLS] == [str(version_dir(tmp_path / "pub", v)) for v in range(1, 5)]
    assert all(c[0] is args and c[2] == [engine] for c in HOOK_CALLS)
    assert all(INDEX in c[3] for c in HOOK_CALLS) and DELTA_FILE in HOOK_CALLS[1][3]
    assert densities[0] == 1.0 and all(0 < d < 1 for d in densities[1:])  # full, then changed bytes only
    local = load_file(tmp_path / "local" / "model.safetensors")
    assert all(torch.equal(local[k], v) for k, v in trainer_model.state_dict().items())


def _header(path) -> dict:
    blob = path.read_bytes()
    return json.loads(blob[8:8 + int.from_bytes(blob[:8], "little")])


def _corrupt_checksum(vdir) -> None:
    """Flip one hex digit of a tensor's checksum in the delta file's header (same length: the file stays valid)."""
    path = vdir / DELTA_FILE
    digest = next(iter(_header(path)["__metadata__"].values()))
    bad = ("0" if digest[0] != "0" else "1") + digest[1:]
    path.write_bytes(path.read_bytes().replace(digest.encode(), bad.encode(), 1))


def test_a_corrupt_delta_is_refused_and_loses_nothing(tmp_path, tiny_model_dir, trainer_model, tiny_tokenizer):
    engine = HFEngine.from_pretrained(tiny_model_dir, tokenizer=tiny_tokenizer)
    options = DeltaOptions(str(tmp_path / "pub"), str(tmp_path / "local"))
    fleet = InProcessFleet(engine, 1 << 20, delta=options)
    opt = torch.optim.AdamW(trainer_model.parameters(), lr=1e-3)
    fleet.update_weights(Source(trainer_model), 1)
    served = {k: v.clone() for k, v in engine.model.state_dict().items()}
    local_bytes = (tmp_path / "local" / "model.safetensors").read_bytes()
    _train_step(trainer_model, opt, tiny_tokenizer)
    fleet._publisher.publish(trainer_model.state_dict().items(), 2)
    _corrupt_checksum(version_dir(tmp_path / "pub", 2))
    with pytest.raises(DeltaError, match=r"weight_v000002: 1 tensor\(s\) fail their xxh3-128 checksum: .*nothing of it was applied"):
        fleet.update_weights(Source(trainer_model), 2)  # the publisher answers its published (corrupted) version 2
    assert (tmp_path / "local" / "model.safetensors").read_bytes() == local_bytes  # not a byte written
    assert read_state(tmp_path / "local")[0] == 1 and engine.get_weight_version() == 1
    assert all(torch.equal(engine.model.state_dict()[k], v) for k, v in served.items())
    assert engine._running.is_set()  # refused before the engine was paused
    # the sync again (the version did not advance): a new chain, in full, since no engine holds the refused bytes
    metrics = fleet.update_weights(Source(trainer_model), 2)
    assert metrics["perf/update_weights_density"] == 1.0 and (version_dir(tmp_path / "pub", 2) / "model.safetensors").exists()
    assert _holds(engine.model, trainer_model) == [] and engine.get_weight_version() == 2
    _train_step(trainer_model, opt, tiny_tokenizer)
    assert fleet.update_weights(Source(trainer_model), 3)["perf/update_weights_density"] < 1.0  # deltas again
    assert _holds(engine.model, trainer_model) == []


def test_pull_continues_a_chain_reseeds_from_a_full_version_and_refuses_other_runs(tmp_path, trainer_model):
    pub = DeltaPublisher(tmp_path / "pub")
    named = lambda: trainer_model.state_dict().items()  # noqa: E731
    pub.publish(named(), 1)
    for v in (2, 3):
        with torch.no_grad():
            trainer_model.lm_head.weight[v].add_(1.0)
        pub.publish(named(), v)
    assert pull(tmp_path / "a", tmp_path / "pub", 3) == 3  # a fresh host: seeds from v1, applies 2 and 3
    assert pull(tmp_path / "a", tmp_path / "pub", 3) == 3  # again: nothing to do (two engines sharing the dir)
    got = load_file(tmp_path / "a" / "model.safetensors")
    assert all(torch.equal(got[k], v) for k, v in trainer_model.state_dict().items())
    # another run's publisher (another stream) restarts the dir with a full version: the local chain is not continued
    other = DeltaPublisher(tmp_path / "pub")
    with torch.no_grad():
        trainer_model.lm_head.weight[5].add_(1.0)
    other.publish(named(), 4)
    with torch.no_grad():
        trainer_model.lm_head.weight[6].add_(1.0)
    other.publish(named(), 5)
    assert pull(tmp_path / "a", tmp_path / "pub", 5) == 5
    got = load_file(tmp_path / "a" / "model.safetensors")
    assert all(torch.equal(got[k], v) for k, v in trainer_model.state_dict().items())
    from miles_core.weights.delta import apply_delta

    with pytest.raises(DeltaError, match="weight_v000005: out of order: it builds on version 4, .* holds version 5"):
        (tmp_path / "a" / ".weight_sync" / "state.json").write_text(json.dumps({"version": "000005", "stream": "x"}))
        apply_delta(tmp_path / "a", version_dir(tmp_path / "pub", 5))


# ---- our HTTP server -------------------------------------------------------------------------------------------------
def test_http_engines_refuse_a_corrupt_delta_before_pausing_and_keep_serving(tmp_path, tiny_model_dir, trainer_model,
                                                                               tiny_tokenizer):
    h = serve_in_thread(HFEngine.from_pretrained(tiny_model_dir, batching="exact"), model_path=str(tiny_model_dir))
    try:
        sender = WeightSender(lambda: trainer_model.state_dict().items(), trainer_model.config)
        sync = WeightSync("disk-delta", 1 << 20, delta=DeltaOptions(str(tmp_path / "pub"), str(tmp_path / "local")))
        with EngineRouter.from_urls([h.url], bucket_bytes=1 << 20, recheck_s=0.0) as router:
            sync.sync(sender, router, 1)
            assert _holds(h.server.engine.model, trainer_model) == []
            served = {k: v.clone() for k, v in h.server.engine.model.state_dict().items()}
            with torch.no_grad():
                trainer_model.model.norm.weight.add_(0.25)
            sender.publish_delta(str(tmp_path / "pub"), 2, "xor", "xxh3-128")
            _corrupt_checksum(version_dir(tmp_path / "pub", 2))
            seen = len(h.server.events)
            with pytest.raises(WeightSyncError, match=r"disk-delta\) to version 2 .*before any engine paused: .*pull_weights"
                                                      r".*fail their xxh3-128 checksum: model.norm.weight"):
                sync.sync(sender, router, 2)
            assert all(torch.equal(h.server.engine.model.state_dict()[k], v) for k, v in served.items())
            assert h.server.engine.weight_version == 1 and read_state(tmp_path / "local")[0] == 1
            assert not [e for e in h.server.events[seen:] if e.startswith(("pause", "weights", "version"))]  # not paused
            sync.sync(sender, router, 2)  # again: a new chain, in full
            assert _holds(h.server.engine.model, trainer_model) == [] and h.server.engine.weight_version == 2
        r = httpx.post(h.url + "/pull_weights", json={"source_dir": str(tmp_path / "pub")}, timeout=10)
        assert r.status_code == 400 and "pull_weights needs local_checkpoint_dir, target_version" in r.json()["message"]
        sync.close()
    finally:
        h.stop()


# ---- the config ------------------------------------------------------------------------------------------------------
BASE = {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "prompt_data": "builtin://arith",
        "update_weight_transfer_mode": "disk-delta", "update_weight_disk_dir": "/mnt/deltas",
        "update_weight_local_checkpoint_dir": "/nvme/ckpt"}


@pytest.mark.parametrize("extra, match", [
    ({"colocate": True}, "disk-delta is for engines that are not colocated"),
    ({"runtime": "ray", "update_weight_mode": "disk"}, "update_weight_mode disk and update_weight_transfer_mode disk-delta"),
    ({"lora_rank": 4, "target_modules": "all-linear"}, "disk-delta with lora_rank > 0 is not supported yet"),
    ({"update_weight_local_checkpoint_dir": None}, "disk-delta needs update_weight_local_checkpoint_dir"),
    ({"update_weight_disk_dir": None}, "disk-delta needs update_weight_disk_dir"),
    ({"update_weight_local_checkpoint_dir": "/mnt/deltas/local"}, "overlap"),
    ({"update_weight_delta_checksum": "blake3"}, "update_weight_delta_checksum blake3 is not supported yet"),
    ({"update_weight_delta_encoding": "bsdiff"}, "update_weight_delta_encoding"),
    ({"custom_update_weight_post_write_path": "tests.weights.test_delta.no_such_hook"},
     "custom_update_weight_post_write_path 'tests.weights.test_delta.no_such_hook'"),
    ({"update_weight_transfer_mode": "broadcast"}, "update_weight_disk_dir applies only to update_weight_transfer_mode disk-delta"),
    ({"update_weight_transfer_mode": "broadcast", "update_weight_disk_dir": None, "update_weight_local_checkpoint_dir": None,
      "update_weight_delta_encoding": "overwrite"}, "update_weight_delta_encoding applies only to"),
])
def test_bad_disk_delta_configs_are_refused_at_load_naming_the_field(extra, match):
    from miles_core.assemble import build_config
    from miles_core.config import ConfigError

    with pytest.raises(ConfigError, match=match):
        build_config({**BASE, **extra})


def test_the_local_runtime_syncs_by_disk_delta_with_the_resolved_hook(tmp_path):
    from miles_core.assemble import build_config
    from miles_core.rollout.http.options import delta_options

    cfg = build_config({**BASE, "update_weight_delta_encoding": "overwrite", "update_weight_delta_checksum": "adler32",
                        "custom_update_weight_post_write_path": "tests.weights.test_delta.post_write"})
    assert cfg.cluster.weight_sync_mode == "disk-delta"
    d = delta_options(cfg)
    assert (d.disk_dir, d.local_dir, d.encoding, d.checksum, d.hook) == ("/mnt/deltas", "/nvme/ckpt", "overwrite", "adler32", post_write)
    assert d.hook_args.update_weight_disk_dir == "/mnt/deltas" and d.hook_args.rollout_batch_size == 2  # the reference's args
    assert delta_options(build_config({k: v for k, v in BASE.items() if not k.startswith("update_weight")})) is None

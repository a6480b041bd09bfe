"""Weight sync under SGLang 0.5.23's rules, on the CPU stand-in (real HTTP servers on 127.0.0.1, real gloo groups):
sessions around tensor / distributed updates, process groups on SGLang's store keys (our sender with SGLang's own
``init_custom_process_group`` on the engine side), and a sync that fails on one engine leaving every engine serving.
Ranks = offset + TP rank with engines of TP 2, in every mode: tests/weights/test_sync_modes.py::test_mode_contract."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import httpx
import pytest
import torch

from miles_core.rollout.hf_engine import HFEngine
from miles_core.rollout.http import EngineRouter, serve_in_thread
from miles_core.rollout.protocol import GenerateRequest, SamplingParams
from miles_core.rollout.sglang.protocol import protocol
from miles_core.weights.broadcast import tcp_address
from miles_core.weights.sync import WeightSender, WeightSync, WeightSyncError

BUCKET = 256 * 1024


@pytest.fixture
def serve(tiny_model_dir):
    handles = []

    def start(**options):
        options = {"model_path": str(tiny_model_dir), "enable_fault_injection": True, "health_timeout_s": 2.0, **options}
        handles.append(serve_in_thread(HFEngine.from_pretrained(tiny_model_dir, batching="exact"), **options))
        return handles[-1]

    yield start
    for h in handles:
        h.stop()


def _holds(handle, model) -> bool:
    got = handle.server.engine.model.state_dict()
    return all(torch.equal(got[k], v) for k, v in model.state_dict().items())


def test_tensor_updates_outside_a_session_are_refused_as_sglang_does(serve):
    """Finding 2: SGLang answers 400 to an update outside begin/end_weight_update; our sync opens the session."""
    h = serve()
    r = httpx.post(h.url + "/update_weights_from_tensor", content=b"", headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 400 and r.json()["message"] == protocol()["session"]["requires_session"]["update_weights_from_tensor"]


SGLANG_RECEIVER = textwrap.dedent("""
    import json, os, sys, torch
    spec = json.loads(sys.argv[1])
    namespace = {"torch": torch, "torch_release": tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])}
    exec(spec["source"], namespace)  # SGLang 0.5.23's own init_custom_process_group, from the wheel (protocol.json)
    pg = namespace["init_custom_process_group"](backend="gloo", init_method=spec["init_method"], world_size=2, rank=1,
                                                 group_name=spec["group_name"])
    t = torch.empty(spec["shape"])
    torch.distributed.broadcast(t, src=0, group=pg)  # as model_runner_components/weight_updater.py receives
    print(json.dumps(t.flatten().tolist()), flush=True)
    torch.distributed.destroy_process_group(pg)  # as SGLang's /destroy_weights_update_group does
    os._exit(0)  # an engine lives on; torch's teardown at interpreter exit after gloo aborted now and then on a busy
    # machine ("terminate called without an active exception", 1 in ~20, the tensor already printed)
""")


def test_our_sender_and_sglangs_own_receiver_form_a_group_and_broadcast():
    """Finding 3: the group is built on PrefixStore(group_name, store) (SGLang utils/common.py ~2859-2927). sglang's
    module does not import here (--no-deps: ``import pybase64`` at utils/common.py:87 fails), so the receiver runs the
    function's source recorded from the wheel by tools/sglang_snapshot.py, in a process of its own."""
    weight = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    sender = WeightSender(lambda: [("w", weight)])
    host, port = sender.master_address()  # its store listens from here on: the receiver may connect before init
    spec = {"source": protocol()["init_custom_process_group"], "init_method": tcp_address(host, port),
            "group_name": "miles-test-group", "shape": [2, 3]}
    receiver = subprocess.Popen([sys.executable, "-c", SGLANG_RECEIVER, json.dumps(spec)], stdout=subprocess.PIPE, text=True)
    try:
        sender.init_broadcast(host, port, 2, "gloo", "miles-test-group")
        sender.broadcast(["w"])
        out, _ = receiver.communicate(timeout=120)
    finally:
        receiver.kill()
    assert receiver.returncode == 0 and json.loads(out.splitlines()[-1]) == weight.flatten().tolist(), out


def test_the_group_port_is_held_from_the_moment_the_engines_are_told_it():
    """A port probed free, closed and bound by the store only after the engines were told it could be taken in
    between (a fresh-clone run on a busy machine failed so: EADDRINUSE in the sender's rendezvous). The address
    master_address returns is already the store's, listening: nobody else can bind it, a client connects."""
    import socket
    from datetime import timedelta

    from torch.distributed import TCPStore

    sender = WeightSender(lambda: [])
    host, port = sender.master_address()
    with socket.socket() as s, pytest.raises(OSError):
        s.bind((host, port))
    client = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=10), wait_for_workers=False)
    client.set("probe", "1")


def test_a_sync_failing_on_one_engine_leaves_every_engine_serving(serve, trainer_model, tiny_tokenizer):
    """Finding 7: the failed engine was marked unhealthy and left paused (pause mode abort), its /health_generate blocked,
    nothing recovered it. Now every paused engine continues, the error names the engine and the rollout, and the next
    sync (the rerun's) reaches both."""
    a, b = serve(), serve()
    httpx.post(b.url + "/debug/fail", json={"mode": "error", "on": "weights"})
    sender = WeightSender(lambda: trainer_model.state_dict().items())
    sync = WeightSync("tensor", BUCKET)
    reqs = [GenerateRequest(tiny_tokenizer("1+1=")["input_ids"], SamplingParams(max_new_tokens=3))]
    with EngineRouter.from_urls([a.url, b.url], {"timeout_s": 20.0}, bucket_bytes=BUCKET, recheck_s=0.0) as router:
        with pytest.raises(WeightSyncError, match=rf"version 3 \(after rollout 1\).*{b.url}"):
            sync.sync(sender, router, 3)
        assert not a.server.engine.in_weight_session and not b.server.engine.in_weight_session  # sessions closed
        for slot in router.slots:  # each engine serves again, at the version it had
            assert [r.weight_version for r in slot.client.generate(reqs, seed=0)] == [0]
        assert router.check_health() == {a.url: True, b.url: True}
        httpx.post(b.url + "/debug/fail", json={"mode": "none"})
        sync.sync(sender, router, 3)
        assert router.engine_versions() == {a.url: 3, b.url: 3} and _holds(a, trainer_model) and _holds(b, trainer_model)
    sync.close()


def test_update_weight_transfer_mode_picks_the_disaggregated_sync_and_disk_delta_is_refused_with_sglang():
    """The reference picks the disaggregated updater by update_weight_transfer_mode (megatron_utils/actor.py): broadcast;
    disk-delta for our engines (they serve /pull_weights), refused with SGLang, whose 0.5.23 snapshot lacks the route;
    p2p needs a Mooncake engine."""
    from miles_core.config import ConfigError, build_config

    base = {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "prompt_data": "builtin://arith", "runtime": "ray"}
    dirs = {"update_weight_disk_dir": "/mnt/deltas", "update_weight_local_checkpoint_dir": "/nvme/ckpt"}
    assert build_config(base).cluster.weight_sync_mode == "broadcast"
    assert build_config({**base, "update_weight_transfer_mode": "broadcast", "colocate": True}).cluster.weight_sync_mode == "tensor"
    assert build_config({**base, "update_weight_transfer_mode": "disk-delta", **dirs}).cluster.weight_sync_mode == "disk-delta"
    assert not any("pull_weights" in route for route in protocol()["routes"])
    with pytest.raises(ConfigError, match="update_weight_transfer_mode disk-delta is not supported yet with rollout_engine "
                                          "sglang: .*/pull_weights.*SGLang 0.5.23"):
        build_config({**base, "update_weight_transfer_mode": "disk-delta", "rollout_engine": "sglang", **dirs})
    with pytest.raises(ConfigError, match="update_weight_transfer_mode p2p is not supported: .*Mooncake"):
        build_config({**base, "update_weight_transfer_mode": "p2p"})
    with pytest.raises(ConfigError, match="update_weight_disk_dir applies only to update_weight_transfer_mode disk-delta"):
        build_config({**base, "update_weight_disk_dir": "/mnt/deltas"})

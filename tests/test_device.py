"""The device resolver (miles_core/device.py) and the parts that take their device from it.

No CUDA is faked: on a machine without CUDA, auto resolves to cpu and cuda is refused; on a GPU machine the
same tests check the CUDA side of each branch."""

from __future__ import annotations

import pytest
import torch

from miles_core.assemble import build_config
from miles_core.device import DeviceUnavailable, resolve_device
from miles_core.preflight import PreflightError, check_gpu_supported

HAS_CUDA = torch.cuda.is_available()
BASE = {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "prompt_data": "builtin://arith", "micro_batch_size": 4}


def test_resolver_maps_each_value():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if HAS_CUDA else "cpu")
    if HAS_CUDA:
        assert resolve_device("cuda") == torch.device("cuda", torch.cuda.current_device())
    else:
        with pytest.raises(DeviceUnavailable, match="device: cuda, but torch sees no CUDA device"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match="device: 'tpu'; expected one of"):
        resolve_device("tpu")


@pytest.mark.parametrize(("values", "message"), [
    ({"runtime": "ray", "colocate": True, "update_weight_mode": "broadcast"}, "update_weight_mode: broadcast .*cannot run"),
])
def test_what_cannot_run_on_a_gpu_is_refused_by_name(values, message):
    cfg = build_config({**BASE, "device": "cuda", **values})
    with pytest.raises(PreflightError, match=message):
        check_gpu_supported(cfg)


def test_what_runs_on_a_gpu_passes():
    for values in ({}, {"runtime": "ray", "colocate": True}, {"runtime": "ray", "update_weight_mode": "broadcast"},
                   {"train_backend": "megatron"}, {"runtime": "ray", "train_backend": "megatron", "colocate": True}):
        check_gpu_supported(build_config({**BASE, "device": "cuda", **values}))  # torch / megatron trainer; tensor sync; NCCL


def test_engines_load_on_the_resolved_device(tiny_model_dir, tmp_path):
    from miles_core.evaluation import load_hf_engine
    from miles_core.rollout.hf_engine import HFEngine
    from miles_core.rollout.http.server import parse_args
    from miles_core.runtime.local import hf_engine_fleet
    from miles_core.runtime.ray.engines import hf_server_args
    from miles_core.runtime.placement import load_run_data

    want = resolve_device("auto")
    for engine in (HFEngine.from_pretrained(tiny_model_dir, device="auto", batching="exact"), load_hf_engine(tiny_model_dir, 3, device="auto")):  # server, eval
        assert {p.device for p in engine.model.parameters()} == {want}
    cfg = build_config({**BASE, "hf_checkpoint": str(tiny_model_dir), "device": "auto", "run_dir": str(tmp_path)})
    fleet = hf_engine_fleet(cfg, load_run_data(cfg))  # the local runtime's in-process engine
    assert {p.device for p in fleet.engine.model.parameters()} == {want}
    args = hf_server_args(cfg)  # a Ray engine actor's server resolves the field in its own process
    assert args[args.index("--device") + 1] == "auto"
    assert parse_args(["--model-path", "m", *args]).device == "auto"


def test_weights_leave_the_trainer_as_cpu_copies():
    from miles_core.weights.sync import WeightSender

    model = torch.nn.Linear(3, 2).to(resolve_device("auto"))
    sent = WeightSender(lambda: model.state_dict().items()).tensors()
    for (name, t), p in zip(sent, model.state_dict().values()):
        assert t.device.type == "cpu" and torch.equal(t, p.cpu())
        assert t.untyped_storage().data_ptr() != p.untyped_storage().data_ptr()  # a copy: a later step cannot change it


def test_ray_workers_never_get_the_drivers_cuda_visible_devices(monkeypatch):
    """Ray sets CUDA_VISIBLE_DEVICES for each actor placed with GPUs; the env miles gives workers must not override it."""
    from miles_core.runtime.ray.session import worker_env

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setenv("MILES_CACHE_DIR", "/tmp/x")
    env = worker_env()
    assert env["MILES_CACHE_DIR"] == "/tmp/x" and "CUDA_VISIBLE_DEVICES" not in env

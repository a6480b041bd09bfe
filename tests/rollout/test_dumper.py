"""miles_core/rollout/dumper.py: SGLang's dumper layout and options (the pinned wheel's DumperConfig, snapshotted in
rollout/sglang/protocol.json), the three phases of a run under the run dir, SGLang's DUMPER_* environment, and the
refusals at load, each naming its field."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from miles_core.assemble import build_config
from miles_core.config import ConfigError
from miles_core.rollout.dumper import Dumper, DumperOptions, facts, parse_pairs, sglang_env

BASE = {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "prompt_data": "builtin://arith"}


def test_pairs_parse_as_sglang_s_dumper_config_does():
    config = facts()["config"]  # the wheel's DumperConfig: name -> annotation, default
    assert config["non_intrusive_mode"]["default"] == "core" and config["enable_model_grad"]["default"] is False
    assert {f.name for f in DumperOptions.__dataclass_fields__.values()} <= set(config)
    assert parse_pairs(["enable=TRUE", "enable_grad=0", "filter=layer_id is None or layer_id < 3", "non_intrusive_mode=all"],
                       "f") == {"enable": True, "enable_grad": False, "filter": "layer_id is None or layer_id < 3",
                                "non_intrusive_mode": "all"}
    assert parse_pairs(["exp_name="], "f") == {"exp_name": None}  # an empty value: the default
    with pytest.raises(ValueError, match="dumper_fwd_only: unknown dumper key 'filtr'"):
        parse_pairs(["filtr=x"], "dumper_fwd_only")
    with pytest.raises(ValueError, match="dumper_fwd_bwd: 'enable' is not key=value"):
        parse_pairs(["enable"], "dumper_fwd_bwd")


def test_a_dump_file_is_named_and_filled_as_sglang_s(tmp_path):
    d = Dumper(DumperOptions(enable=True, dir=str(tmp_path), exp_name="x", enable_grad=True, filter="layer_id != 1"), rank=3,
               world_size=4, parallel_info={"megatron": {"tp_rank": 1}})
    a = torch.ones(2, 3, requires_grad=True)
    h = a * 2
    d.set_ctx(layer_id=0)
    d.dump("h", h, dims="b h")
    d.set_ctx(layer_id=1)
    d.dump("skipped", a)  # filtered out by its context
    d.set_ctx(layer_id=None)
    d.step()
    (h * 3).sum().backward()  # enable_grad: h's gradient, at the step h was dumped in (SGLang's: no context tags)
    files = sorted(p.name for p in (tmp_path / "x").glob("*.pt"))
    assert files == ["step=0___rank=3___dump_index=1___name=h___recompute_status=disabled___layer_id=0.pt",
                     "step=0___rank=3___dump_index=2___name=grad__h.pt"]
    assert torch.equal(torch.load(tmp_path / "x" / files[1], weights_only=False)["value"], torch.full((2, 3), 3.0))
    payload = torch.load(tmp_path / "x" / files[0], weights_only=False)
    assert torch.equal(payload["value"], torch.full((2, 3), 2.0))
    assert payload["meta"] == {"step": 0, "rank": 3, "dump_index": 1, "name": "h", "recompute_status": "disabled", "layer_id": 0,
                               "world_rank": 3, "world_size": 4, "megatron_parallel_info": {"tp_rank": 1}, "dims": "b h"}
    d.configure(enable=False)
    d.dump("off", a)
    assert len(list((tmp_path / "x").glob("*.pt"))) == 2


def test_a_run_dumps_its_three_phases_under_the_run_dir(tmp_path):
    from flows.recipes import load_config
    from miles_core.runtime.placement import build_runtime

    cfg = load_config("tiny", {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "rollout_max_response_len": 3,
                               "num_steps_per_rollout": 2, "num_rollout": 1, "num_threads": 1, "eval_prompt_data": None,
                               "run_dir": str(tmp_path / "run"), "dumper_enable": True})
    rt = build_runtime(cfg)
    try:
        rt.generate(0)
        rt.train(0)
    finally:
        rt.close()
    root = tmp_path / "run" / "dumper"  # dumper_dir's default (the reference's /tmp/dumper) is the run dir's here
    names = {p.parent.relative_to(root).as_posix(): set() for p in root.rglob("*.pt")}
    for p in root.rglob("*.pt"):
        names[p.parent.relative_to(root).as_posix()].add(dict(kv.split("=", 1) for kv in p.stem.split("___"))["name"])
    assert set(names) == {"engines/engine_0", "fwd_only/rollout_0", "fwd_bwd/rollout_0"}
    assert all(n >= {"input_ids", "position_ids"} for n in names.values())  # non_intrusive_mode core: the inputs


@pytest.mark.parametrize(("values", "match"), [
    ({"dumper_enable": True, "dumper_fwd_only": ["server_port=reuse"]}, "dumper_fwd_only: dumper key server_port is not supported yet"),
    ({"dumper_enable": True, "dumper_fwd_bwd": ["grafter_enable=1"]}, "dumper_fwd_bwd: dumper key grafter_enable is not supported yet"),
    ({"dumper_enable": True, "dumper_inference": ["no_such_key=1"]}, "dumper_inference: unknown dumper key 'no_such_key'"),
    ({"dumper_enable": True, "dumper_fwd_only": ["non_intrusive_mode=most"]}, "non_intrusive_mode 'most'"),
    ({"dumper_fwd_bwd": ["enable_model_grad=1"]}, "dumper_fwd_bwd sets enable_model_grad but its phase is off"),
    ({"dumper_enable": True, "dumper_source_patcher_config_inference": "p.yaml"},
     "dumper_source_patcher_config_inference is not supported yet with rollout_engine hf"),
    ({"dumper_enable": True, "async_mode": "fully"}, "dumper_inference .dumper_enable. with async_mode fully is not supported yet"),
])
def test_what_the_dumper_cannot_do_is_refused_at_load_naming_the_field(values, match):
    with pytest.raises(ConfigError, match=match):
        build_config({**BASE, **values})


def test_sglang_servers_get_the_reference_s_dumper_environment(tmp_path):
    ray_sglang = {**BASE, "runtime": "ray", "rollout_engine": "sglang", "run_dir": str(tmp_path), "update_weight_mode": "disk"}
    assert sglang_env(build_config(ray_sglang)) == {}  # the inference phase off
    cfg = build_config({**ray_sglang, "dumper_enable": True, "dumper_source_patcher_config_inference": "patch.yaml",
                        "dumper_inference": ["non_intrusive_mode=all", "grafter_enable=0"]})  # SGLang's own keys pass
    env = sglang_env(cfg)
    assert env == {"DUMPER_SERVER_PORT": "reuse", "DUMPER_NON_INTRUSIVE_MODE": "all", "DUMPER_SOURCE_PATCHER_CONFIG": "patch.yaml"}
    config, prefix = facts()["config"], facts()["env_prefix"]
    assert {k.removeprefix(prefix).lower() for k in env} <= set(config)  # DumperConfig's own env names (from_env)
    route_on = facts()["route_condition"]  # http_server.py: the condition SGLang registers /dumper/{method} under
    assert eval(route_on, {"os": SimpleNamespace(environ=env)}) and not eval(route_on, {"os": SimpleNamespace(environ={})})
    with pytest.raises(ConfigError, match="applies only with the inference phase on"):
        build_config({**ray_sglang, "dumper_source_patcher_config_inference": "patch.yaml"})

"""Every config field is read by code, or refused when set ("not supported yet"): nothing is accepted and
ignored. Table-driven: implementing a field removes its line from rules.NOT_SUPPORTED (and from VALUES here),
a backend value its line from config/backends.SUPPORTED."""

from __future__ import annotations

import ast

import pytest

from miles_core.config import ConfigError, rules
from miles_core.assemble import build_config
from miles_core.preflight import PreflightError, preflight
from tools.docs import facts

BASE = {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "prompt_data": "builtin://arith"}
VALUES = {"min_lr": 1e-7, "offload_train_disk_dir": "/tmp/x", "sglang_router_ip": "10.0.0.1", "sglang_router_port": 30000}  # a non-default value per NOT_SUPPORTED entry


def test_every_field_is_read_by_code_or_refused_at_load():
    unused = facts.unused_config_fields()
    assert set(VALUES) == set(rules.NOT_SUPPORTED)
    read_nowhere = sorted(n for n in facts.config_fields() if n in unused and n not in rules.NOT_SUPPORTED)
    assert not read_nowhere, f"fields no code reads and no rule refuses: {read_nowhere}"
    assert unused >= set(rules.NOT_SUPPORTED)  # a refused field that code reads now: drop its NOT_SUPPORTED line


@pytest.mark.parametrize("name", sorted(VALUES))
def test_a_field_not_supported_yet_is_refused_at_load_naming_it(name):
    build_config(BASE)  # the default is fine
    with pytest.raises(ConfigError, match=f"{name} is not supported yet"):
        build_config({**BASE, name: VALUES[name]})


def test_sglang_without_its_install_is_refused_at_run_start_with_the_install_command(tmp_path):
    import importlib.util

    cfg = build_config({**BASE, "runtime": "ray", "rollout_engine": "sglang", "run_dir": str(tmp_path / "run")})  # validates
    if importlib.util.find_spec("sglang") is None:  # the default install: never has it
        with pytest.raises(PreflightError, match="rollout_engine: .*pip install"):
            preflight(cfg)
    else:
        preflight(cfg)


def test_device_cuda_without_cuda_is_refused_at_run_start_naming_the_field(tmp_path):
    import torch

    cfg = build_config({**BASE, "device": "cuda", "run_dir": str(tmp_path / "run")})
    if torch.cuda.is_available():  # a GPU machine: the torch trainer and the HF engine run there
        preflight(cfg)
    else:
        with pytest.raises(PreflightError, match="device: cuda.*torch sees no CUDA device"):
            preflight(cfg)
    preflight(build_config({**BASE, "device": "cpu", "run_dir": str(tmp_path / "run")}))
    preflight(build_config({**BASE, "device": "auto", "run_dir": str(tmp_path / "run")}))


BY_GROUP = {"cluster": {"device", "update_weight_mode"}, "algo": {"lr"}}


@pytest.mark.parametrize(("code", "reads"), [
    ("x = tensor.device", set()),  # a tensor's .device is not the config field
    ("torch.zeros(3, device=d)", set()),  # nor a keyword of that name
    ("cfg.cluster.device", {"device"}),
    ("cl = cfg.cluster\ncl.device", {"device"}),
    ("r, a = c.rollout, c.algo\na.lr", {"lr"}),
    ("def f(algo: AlgoConfig):\n    return algo.lr", {"lr"}),
    ("self.algo = cfg.algo\nself.algo.lr", {"lr"}),
])
def test_the_planned_detector_counts_config_reads_only(code, reads):
    assert facts.field_reads(ast.parse(code), BY_GROUP) & {"device", "update_weight_mode", "lr"} == reads


def test_a_field_read_through_a_config_property_is_not_planned():
    tree = ast.parse("class C:\n    @property\n    def mode(self):\n        return self.update_weight_mode or 'tensor'\n")
    assert "update_weight_mode" in facts._property_reads(tree)
    assert "update_weight_mode" not in facts.unused_config_fields()

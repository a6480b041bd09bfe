"""rollout_external_engine_addrs at load: addresses checked (host:port or http(s)://host:port), and the
combinations the external fleet does not run refused naming the fields."""

from __future__ import annotations

import pytest

from miles_core.config import ConfigError
from miles_core.assemble import build_config
from miles_core.config.rollout import engine_url

BASE = {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "prompt_data": "builtin://arith"}


@pytest.mark.parametrize(("addr", "url"), [("10.0.0.5:30000", "http://10.0.0.5:30000"), ("http://node-1:8000/", "http://node-1:8000"),
                                           ("https://engines.example:443", "https://engines.example:443")])
def test_engine_addresses_in_both_forms(addr, url):
    assert engine_url(addr) == url


@pytest.mark.parametrize("addr", ["10.0.0.5", "http://host", "ftp://host:21", "host:port", "http://host:80/generate"])
def test_a_bad_address_fails_at_load_naming_the_field_and_the_address(addr):
    with pytest.raises(ConfigError, match=rf"rollout_external_engine_addrs.*{addr!r} is not an engine address"):
        build_config({**BASE, "rollout_external_engine_addrs": [addr]})


def test_an_address_listed_twice_fails():
    with pytest.raises(ConfigError, match="listed twice"):
        build_config({**BASE, "rollout_external_engine_addrs": ["127.0.0.1:8000", "http://127.0.0.1:8000"]})


@pytest.mark.parametrize(("extra", "message"), [
    ({"colocate": True}, "colocate shares devices"),
    ({"runtime": "ray", "colocate": True}, "colocate shares devices"),
    ({"rollout_engine": "sglang"}, "set update_weight_mode: disk"),  # tensor (the default) cannot reach SGLang
    ({"rollout_engine": "sglang", "update_weight_mode": "disk", "sglang_mem_fraction_static": 0.5}, "sglang_mem_fraction_static"),
])
def test_combinations_the_external_fleet_does_not_run_are_refused(extra, message):
    with pytest.raises(ConfigError, match=message):
        build_config({**BASE, "rollout_external_engine_addrs": ["127.0.0.1:8000"], **extra})


@pytest.mark.parametrize(("extra", "mode"), [
    ({}, "tensor"), ({"update_weight_mode": "disk"}, "disk"), ({"update_weight_mode": "broadcast"}, "broadcast"),
    ({"rollout_engine": "sglang", "update_weight_mode": "disk"}, "disk"),
    ({"runtime": "ray"}, "broadcast"),  # disaggregated on Ray: broadcast by default, as with engines it launches
    ({"runtime": "ray", "update_weight_mode": "tensor"}, "tensor"),
])
def test_what_the_external_fleet_runs_loads(extra, mode):
    """Either runtime; our servers take tensor, broadcast or disk; SGLang's (no sglang install needed: nothing is
    launched) disk."""
    cfg = build_config({**BASE, "rollout_external_engine_addrs": ["127.0.0.1:8000"], **extra})
    assert cfg.cluster.weight_sync_mode == mode


def test_sglang_external_engines_need_no_sglang_install(tmp_path):
    from miles_core.preflight import preflight

    preflight(build_config({**BASE, "rollout_external_engine_addrs": ["127.0.0.1:8000"], "rollout_engine": "sglang",
                            "update_weight_mode": "disk", "run_dir": str(tmp_path / "run")}))


def test_rollout_external_needs_the_engine_addresses():
    """The reference's switch: engines already running (placement reserves no rollout GPUs); their addresses are
    rollout_external_engine_addrs (its allocate_rollout_engine_addr_and_ports_external reads them)."""
    with pytest.raises(ConfigError, match="rollout_external uses engines already running, at rollout_external_engine_addrs"):
        build_config({**BASE, "rollout_external": True})
    cfg = build_config({**BASE, "rollout_external": True, "rollout_external_engine_addrs": ["127.0.0.1:8000"],
                        "runtime": "ray", "colocate": False})
    assert cfg.rollout.rollout_external and cfg.cluster.weight_sync_mode == "broadcast"
    with pytest.raises(ConfigError, match="colocate shares devices with engines miles launches"):
        build_config({**BASE, "rollout_external": True, "rollout_external_engine_addrs": ["127.0.0.1:8000"], "colocate": True,
                      "runtime": "ray"})

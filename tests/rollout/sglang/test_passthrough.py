"""sglang_* passthrough: validation at config load, the CLI flags, and the exact launch command, checked by
parsing it back with an argparse parser built from the snapshot the way SGLang builds its own (verify.snapshot_parser)."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap

import pytest

from flows.cli import parse_overrides
from miles_core.config import ConfigError
from flows.recipes import list_recipes, load_config, read_recipe
from miles_core.assemble import build_config
from miles_core.rollout.sglang import SGLANG_VERSION
from miles_core.rollout.sglang.launch import (EngineLaunch, SGLangNotInstalled, check_sglang_installed, engine_client_options,
                                             launch_command, require_sglang)
from miles_core.config.server_args import PassthroughError, parse_cli, snapshot, to_argv, validate
from miles_core.rollout.sglang.verify import snapshot_parser

SGLANG = {"runtime": "ray", "rollout_engine": "sglang"}


def cfg(**over):
    return load_config("tiny", {**SGLANG, **over})


def test_recipe_keys_become_server_args():
    c = cfg(sglang_mem_fraction_static=0.7, sglang_enable_metrics=True, sglang_data_parallel_size=2)
    assert c.sglang.sglang_server_args == {"mem_fraction_static": 0.7, "enable_metrics": True, "dp_size": 2}  # alias -> field


@pytest.mark.parametrize("over, needle", [
    ({"sglang_mem_fracton_static": 0.7}, "sglang_mem_fracton_static (--sglang-mem-fracton-static) is not a server argument of "
     f"SGLang {SGLANG_VERSION}; nearest: sglang_mem_fraction_static (--sglang-mem-fraction-static)"),
    ({"sglang_mem_fraction_static": "high"}, "sglang_mem_fraction_static: expected float for --mem-fraction-static, got 'high'"),
    ({"sglang_port": 30000}, "miles sets --port itself"),
    ({"sglang_tp_size": 2}, "set rollout_num_gpus_per_engine"),
    ({"sglang_enable_metrics": "yes"}, "expected bool"),
    ({"sglang_cuda_graph_bs_decode": [1, "two"]}, "expected a list of int"),
    ({"sglang_tokenizer_mode": "fast"}, "'fast' is not one of ['auto', 'slow']"),
    ({"sglang_dp_size": 2, "sglang_data_parallel_size": 2}, "is given twice"),
    ({"sglang_config": "groups.yaml"}, "not supported yet"),
    ({"sglang_router_ip": "10.0.0.1"}, "sglang_router_ip is not supported yet"),
    ({"sglang_router_policy": "cache_aware"}, "sglang_router_policy"),
])
def test_bad_passthrough_fails_at_load_naming_the_key(over, needle):
    with pytest.raises(ConfigError) as e:
        cfg(**over)
    assert needle in str(e.value)


def test_passthrough_needs_rollout_engine_sglang():
    with pytest.raises(ConfigError, match="sglang_mem_fraction_static: SGLang server arguments apply only with rollout_engine sglang"):
        load_config("tiny", {"sglang_mem_fraction_static": 0.7})


def test_named_choices_are_open_closed_ones_enforced():
    attn = snapshot().args["attention_backend"]
    assert attn.choices_open and "triton" in attn.choices
    assert validate({"attention_backend": "my_plugin_backend"}) == {"attention_backend": "my_plugin_backend"}


def test_cli_flags_read_like_sglangs_argparse():
    argv = ["--sglang-mem-fraction-static", "0.7", "--sglang-enable-metrics", "--sglang-cuda-graph-bs-decode", "1", "2", "4",
            "--sglang-log-level=debug", "--sglang-no-enable-tf32-matmul", "--sglang-json-model-override-args", '{"a": 1}',
            "--sglang-served-model-name", "1.5", "--sglang-chunked-prefill-size", "4096"]
    assert parse_cli(argv) == {"mem_fraction_static": 0.7, "enable_metrics": True, "cuda_graph_bs_decode": [1, 2, 4],
                               "log_level": "debug", "enable_tf32_matmul": False, "json_model_override_args": '{"a": 1}',
                               "served_model_name": "1.5", "chunked_prefill_size": 4096}  # str stays text, as argparse keeps it
    with pytest.raises(PassthroughError, match="expected int for --chunked-prefill-size, got 'big'"):
        parse_cli(["--sglang-chunked-prefill-size", "big"])
    with pytest.raises(PassthroughError, match="there is no --sglang-no-enable-metrics"):
        parse_cli(["--sglang-no-enable-metrics"])
    with pytest.raises(PassthroughError, match="unexpected argument 'stray'"):
        parse_cli(["stray"])
    with pytest.raises(PassthroughError, match="needs a value"):
        parse_cli(["--sglang-log-level"])


def test_cli_overrides_win_over_the_recipe(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(textwrap.dedent("""\
        extends: tiny
        runtime: ray
        rollout_engine: sglang
        sglang_mem_fraction_static: 0.5
        sglang_log_level: warning
    """))
    over = parse_overrides({"sglang_mem_fraction_static": 0.8, "rollout_batch_size": "4"})
    c = load_config(str(recipe), over)
    assert c.sglang.sglang_server_args == {"mem_fraction_static": 0.8, "log_level": "warning"}


def _sglang_parser():
    return snapshot_parser()


def _server_argv(argv: list[str]) -> list[str]:
    """The server's own arguments of ``python -m sglang.launch_server ...``."""
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    return argv[3:]


PASSTHROUGH = {"sglang_mem_fraction_static": 0.7, "sglang_enable_metrics": True, "sglang_enable_tf32_matmul": False,
               "sglang_cuda_graph_bs_decode": [1, 2, 8], "sglang_log_level": "debug", "sglang_attention_backend": "triton",
               "sglang_uvicorn_access_log_exclude_prefixes": [], "sglang_json_model_override_args": '{"rope_theta": 1e6}',
               "sglang_disable_radix_cache": False, "sglang_chunked_prefill_size": 4096}


def test_launch_command_is_exact():
    c = cfg(rollout_num_gpus_per_engine=4, colocate=True, seed=7, sglang_mem_fraction_static=0.7, sglang_enable_metrics=True,
            sglang_cuda_graph_bs_decode=[1, 2], sglang_disable_radix_cache=False)
    spec = EngineLaunch(model_path="/ckpt/hf", host="10.0.0.5", port=30001, api_key="KEY", engine_index=2)
    assert launch_command(c, spec, python="py") == [
        "py", "-m", "sglang.launch_server", "--model-path", "/ckpt/hf", "--host", "10.0.0.5", "--port", "30001",
        "--tp-size", "4", "--api-key", "KEY", "--random-seed", "9", "--enable-memory-saver",
        "--mem-fraction-static", "0.7", "--enable-metrics", "--cuda-graph-bs-decode", "1", "2"]  # store_true False: nothing
    one = EngineLaunch(model_path="/m", host="h", port=1, api_key="K")
    assert "--enable-memory-saver" not in launch_command(cfg(), one)  # nothing released: no memory saver
    assert "--enable-memory-saver" in launch_command(cfg(runtime="ray", offload_rollout=True), one)  # not colocated, offloaded
    assert "--enable-memory-saver" not in launch_command(cfg(runtime="ray", colocate=True, offload_rollout=False), one)
    two = EngineLaunch(model_path="/m", host="h", port=1, api_key="K", nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:5000")
    assert launch_command(cfg(), two)[-6:] == ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:5000"]
    assert launch_command(cfg(), two)[0] == sys.executable
    with pytest.raises(ValueError, match="api_key is empty"):
        launch_command(c, EngineLaunch(model_path="/m", host="h", port=1, api_key=""))
    with pytest.raises(ValueError, match="needs dist_init_addr"):
        launch_command(c, EngineLaunch(model_path="/m", host="h", port=1, api_key="K", nnodes=2))


def test_launch_command_parses_back_to_the_config_values():
    c = cfg(rollout_num_gpus_per_engine=2, **PASSTHROUGH)
    argv = launch_command(c, EngineLaunch(model_path="/m", host="0.0.0.0", port=5, api_key="K"))
    ns = _sglang_parser().parse_args(_server_argv(argv))
    assert (ns.model_path, ns.host, ns.port, ns.tp_size, ns.api_key, ns.random_seed) == ("/m", "0.0.0.0", 5, 2, "K", c.misc.seed)
    for key, value in PASSTHROUGH.items():
        assert getattr(ns, key.removeprefix("sglang_")) == value, key
    assert ns.enable_memory_saver is False  # not colocated


def test_every_kind_renders_to_what_argparse_reads_back():
    """One argument of each (kind, type) in the snapshot, at a non-default value, round-trips."""
    samples = {"bool": True, "int": 3, "float": 0.25, "str": "x", "json": {"k": [1]}, "json_list": ["a"],
               "list[int]": [1, 2], "list[float]": [0.5], "list[str]": ["a", "b"]}
    parser, seen = _sglang_parser(), set()
    for a in snapshot().args.values():
        if (a.kind, a.type) in seen or a.choices or a.deprecated:
            continue
        seen.add((a.kind, a.type))
        value = False if a.kind == "boolean_optional" and a.default is True else samples[a.type]
        if a.kind == "optional_value":
            value = "x"
        ns = parser.parse_args(to_argv(a.name, validate({a.name: value})[a.name]))
        assert getattr(ns, a.name) == value, (a.name, a.kind, a.type)
    assert len(seen) >= 10


def test_engine_client_options():
    assert engine_client_options(cfg(sglang_router_request_timeout_secs=60), "K") == {"api_key": "K", "timeout_s": 60.0}


def test_require_sglang(tmp_path, monkeypatch):
    require_sglang(load_config("tiny"))  # hf engine: nothing to check
    with pytest.raises(SGLangNotInstalled, match=r"pip install 'miles\[sglang\]'"):
        require_sglang(cfg())  # the test venv has no sglang
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("raise RuntimeError('require_sglang must not import sglang')\n")
    (tmp_path / "sglang-0.4.0.dist-info").mkdir()
    (tmp_path / "sglang-0.4.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.4.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SGLangNotInstalled, match=f"needs SGLang {SGLANG_VERSION} .* but 0.4.0 is installed"):
        require_sglang(cfg())
    (tmp_path / "sglang-0.4.0.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {SGLANG_VERSION}\n")
    require_sglang(cfg())
    assert "sglang" not in sys.modules


SGLANG_RECIPES = [r for r in list_recipes() if read_recipe(r).get("rollout_engine") == "sglang"]


@pytest.mark.parametrize("recipe", SGLANG_RECIPES)
def test_every_sglang_recipe_launches_with_its_server_args(recipe):
    c = load_config(recipe)
    argv = launch_command(c, EngineLaunch(model_path="/m", host="10.0.0.2", port=30000, api_key="K"))
    ns = _sglang_parser().parse_args(_server_argv(argv))
    assert ns.tp_size == c.cluster.rollout_num_gpus_per_engine and ns.enable_memory_saver is c.cluster.colocate
    for name, value in c.sglang.sglang_server_args.items():
        assert getattr(ns, name) == value, (recipe, name)


def test_a_recipe_setting_sglang_server_args_replaces_the_inherited_passthroughs(tmp_path):
    assert load_config("glm4-5").sglang.sglang_server_args["attn_dp_size"] == 4
    assert load_config("glm4-5-debug").sglang.sglang_server_args == {}  # extends glm4-5, no SGLang engine
    child = tmp_path / "child.yaml"
    child.write_text("extends: glm4-5\nsglang_server_args: {log_level: debug}\nsglang_ep_size: 8\n")
    assert load_config(str(child)).sglang.sglang_server_args == {"log_level": "debug", "ep_size": 8}
    child.write_text("extends: glm4-5\nsglang_ep_size: 8\n")  # without it, keys are set on top of the parent's
    args = load_config(str(child)).sglang.sglang_server_args
    assert args["ep_size"] == 8 and args["attn_dp_size"] == 4


def test_miles_config_takes_passthrough_flags_mixed_with_config_flags():
    from typer.testing import CliRunner

    from flows.cli import app

    runner = CliRunner()
    ok = runner.invoke(app, ["config", "tiny", "--runtime", "ray", "--sglang-enable-metrics", "--rollout-engine", "sglang",
                             "--sglang-cuda-graph-bs-decode", "1", "2", "--sglang-mem-fraction-static", "0.6", "--as-params"])
    assert ok.exit_code == 0, ok.output
    args = json.loads(ok.output)["config"]["sglang"]["sglang_server_args"]
    assert args == {"enable_metrics": True, "cuda_graph_bs_decode": [1, 2], "mem_fraction_static": 0.6}
    bad = runner.invoke(app, ["config", "tiny", "--runtime", "ray", "--rollout-engine", "sglang", "--sglang-cuda-graph-bs", "8"])
    assert bad.exit_code == 2 and "nearest: sglang_cuda_graph_bs_decode" in bad.output and "Traceback" not in bad.output


def test_server_args_survive_the_mlflow_params_round_trip():
    """An eval rebuilds the training config from its MLflow params: a str argument stays text ("1.5")."""
    from miles_core.evaluation.ledger import config_values_from_params
    from miles_core.tracking.keys import flatten
    from miles_core.tracking.mlflow_tracker import param_str

    c = cfg(sglang_served_model_name="1.5", sglang_cuda_graph_bs_decode=[1, 2], sglang_mem_fraction_static=0.7)
    params = {k: param_str(v) for k, v in flatten(c.model_dump(mode="json")).items()}
    assert params["sglang.sglang_server_args.served_model_name"] == "1.5"
    assert build_config(config_values_from_params(params)) == c


def test_check_sglang_installed_names_the_install_command():
    with pytest.raises(SGLangNotInstalled, match=r"not installed here; install it with: pip install 'miles\[sglang\]'"):
        check_sglang_installed()


LORA_SYNC = {"lora_rank": 8, "lora_alpha": 16, "lora_sync_from_tensor": True, "update_weight_mode": "disk"}


def test_engines_that_serve_the_adapter_launch_with_sglangs_lora_arguments():
    """lora_sync_from_tensor: --enable-lora, one adapter slot, max rank = lora_rank, the target modules (the reference's
    sglang_engine.py); every flag and value is one SGLang 0.5.23's argparse reads (the snapshot's parser)."""
    from miles_core.rollout.sglang.launch import lora_server_args

    spec = EngineLaunch(model_path="/m", host="h", port=1, api_key="K")
    every = cfg(**LORA_SYNC, target_modules="all-linear")
    ns = _sglang_parser().parse_args(_server_argv(launch_command(every, spec)))
    assert (ns.enable_lora, ns.max_loras_per_batch, ns.max_lora_rank, ns.lora_target_modules) == (True, 1, 8, ["all"])
    assert ns.lora_paths is None  # the sync before rollout 0 loads the adapter (/load_lora_adapter)
    some = cfg(**LORA_SYNC, target_modules="linear_qkv,o_proj", exclude_modules="k_proj")
    assert _sglang_parser().parse_args(_server_argv(launch_command(some, spec))).lora_target_modules == ["q_proj", "v_proj", "o_proj"]
    minus = cfg(**LORA_SYNC, target_modules="all-linear", exclude_modules="down_proj")
    assert lora_server_args(minus)["lora_target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj"]
    assert validate(lora_server_args(some)) == lora_server_args(some)  # names and values SGLang's CLI takes
    merged = cfg(lora_rank=8, target_modules="all-linear")  # merged weights: a plain model, no LoRA arguments
    assert "--enable-lora" not in launch_command(merged, spec) and lora_server_args(merged) == {}
    backup = cfg(**LORA_SYNC, target_modules="all-linear", lora_base_cpu_backup=True, colocate=True)
    assert _sglang_parser().parse_args(_server_argv(launch_command(backup, spec))).enable_weights_cpu_backup is True
    assert not ns.enable_weights_cpu_backup  # only with lora_base_cpu_backup

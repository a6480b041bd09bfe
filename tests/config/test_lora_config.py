"""The lora group: the reference's names and defaults (flags.tsv), its module names, and what is refused at load."""

from __future__ import annotations

import pytest

from miles_core.config import ConfigError, LoraConfig, build_config
from miles_core.config.reference_flags import reference_flags

BASE = {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "prompt_data": "builtin://arith"}
LORA_ON = {"lora_rank": 4, "target_modules": "all-linear"}


def test_fields_keep_the_reference_names_and_defaults():
    ref = {f.removeprefix("--").replace("-", "_"): d for f, g, d in reference_flags() if g == "lora"}
    fields = LoraConfig.model_fields
    for name in ("lora_rank", "lora_alpha", "lora_dropout", "lora_type", "target_modules", "exclude_modules",
                 "lora_adapter_path", "lora_sync_from_tensor", "lora_train_only", "lora_base_cpu_backup"):
        assert repr(fields[name].default) == ref[name], name


@pytest.mark.parametrize(("value", "targets"), [
    ("all-linear", "all-linear"),
    ("q_proj,v_proj", ("q_proj", "v_proj")),
    (["q_proj", " o_proj"], ("q_proj", "o_proj")),
    ("linear_qkv,linear_proj", ("q_proj", "k_proj", "v_proj", "o_proj")),  # the reference's Megatron names
    ("linear_fc1,linear_fc2", ("gate_proj", "up_proj", "down_proj")),
])
def test_target_modules_accepts_the_reference_names(value, targets):
    assert build_config({**BASE, "lora_rank": 4, "target_modules": value}).lora.targets == targets


@pytest.mark.parametrize(("extra", "match"), [
    ({"lora_rank": 4}, "lora_rank > 0 needs target_modules"),
    ({"target_modules": "q_proj"}, "target_modules apply only with lora_rank > 0"),
    ({"lora_rank": 4, "target_modules": "q_proj", "exclude_modules": "q_proj"}, "exclude_modules .* removes every module"),
    ({"lora_rank": 4, "target_modules": "all-linear", "train_backend": "megatron", "runtime": "ray", "lora_dropout": 0.1},
     r"train_backend megatron and lora_dropout 0.1 .* not supported yet"),
    ({"lora_rank": 4, "target_modules": "all-linear", "advantage_estimator": "ppo"}, "lora_rank with advantage_estimator ppo"),
    ({"lora_rank": 4, "target_modules": "all-linear", "runtime": "ray", "actor_num_gpus_per_node": 2, "train_backend": "megatron"},
     "train_backend megatron on a train group of 2 ranks"),
    ({"multi_lora_n_adapters": 2}, "multi_lora_n_adapters .* not supported yet"),
    ({"experts_shared_outer_loras": True}, "experts_shared_outer_loras .* not supported yet"),
    ({"lora_rank": -1}, "lora_rank"),
    ({"lora_sync_from_tensor": True}, "lora_sync_from_tensor apply only with lora_rank > 0"),
    ({**LORA_ON, "lora_sync_from_tensor": True, "colocate": True, "runtime": "ray"},
     "lora_sync_from_tensor with colocate: .* set lora_base_cpu_backup"),
    ({**LORA_ON, "lora_base_cpu_backup": True, "lora_sync_from_tensor": True, "runtime": "ray"},
     "lora_base_cpu_backup .* needs colocate"),
    ({**LORA_ON, "lora_base_cpu_backup": True, "colocate": True, "runtime": "ray"},
     r"lora_base_cpu_backup .* needs lora_sync_from_tensor \(a merged sync"),
    ({**LORA_ON, "lora_base_cpu_backup": True, "lora_sync_from_tensor": True, "colocate": True, "runtime": "ray",
      "offload_rollout_level": ["kv_cache"]}, "lora_base_cpu_backup .* needs offload_rollout with offload_rollout_level weight"),
    ({**LORA_ON, "lora_sync_from_tensor": True, "rollout_engine": "sglang", "runtime": "ray"},
     "lora_sync_from_tensor with rollout_engine sglang and update_weight_mode broadcast: .* set update_weight_mode: disk"),
    ({**LORA_ON, "lora_sync_from_tensor": True, "runtime": "ray", "update_weight_mode": "broadcast"},
     "lora_sync_from_tensor with update_weight_mode broadcast is not supported yet"),
    ({**LORA_ON, "lora_sync_from_tensor": True, "rollout_engine": "sglang", "runtime": "ray", "update_weight_mode": "disk",
      "sglang_max_lora_rank": 8}, "sglang_max_lora_rank: with lora_sync_from_tensor miles launches SGLang with its LoRA"),
    ({"check_lora_weight_equal": True}, "check_lora_weight_equal apply only with lora_rank > 0"),
    ({**LORA_ON, "check_lora_weight_equal": True}, "check_lora_weight_equal checks adapter syncs, and without "
     "lora_sync_from_tensor"),
    ({**LORA_ON, "lora_sync_from_tensor": True, "check_lora_weight_equal": True, "runtime": "ray", "update_weight_mode": "disk"},
     "check_lora_weight_equal with update_weight_mode disk is not supported yet"),
    ({"multi_lora_api_port": 9000}, "multi_lora_api_port .* not supported yet: it configures the reference's multi-LoRA controller"),
    ({"multi_lora_adapter": ["a", "b"]}, "multi_lora_adapter .* not supported yet: it registers an adapter"),
    ({"multi_lora_max_empty_wait_s": 1.0}, "multi_lora_max_empty_wait_s .* not supported yet: it times the reference's multi-LoRA"),
    ({**LORA_ON, "lora_sync_from_tensor": True, "lora_train_only": True}, "lora_sync_from_tensor with lora_train_only"),
    ({**LORA_ON, "lora_train_only": True, "train_backend": "megatron", "runtime": "ray"},
     "lora_train_only with train_backend megatron"),
    ({**LORA_ON, "lora_base_cpu_backup": True}, "lora_base_cpu_backup .* colocated engine's base"),
])
def test_refused_at_load_naming_the_field(extra, match):
    with pytest.raises(ConfigError, match=match):
        build_config({**BASE, **extra})


def test_the_reference_defaults_of_refused_options_are_accepted():
    build_config({**BASE, "lora_type": "lora", "lora_sync_from_tensor": False, "lora_train_only": False})


def test_adapter_sync_and_train_only_are_accepted_on_the_torch_trainer():
    assert build_config({**BASE, **LORA_ON, "lora_sync_from_tensor": True}).lora.lora_sync_from_tensor
    assert build_config({**BASE, **LORA_ON, "lora_train_only": True}).lora.lora_train_only


def test_the_adapter_sync_to_sglang_engines_goes_by_disk_and_the_check_with_tensors():
    sglang = build_config({**BASE, **LORA_ON, "lora_sync_from_tensor": True, "rollout_engine": "sglang", "runtime": "ray",
                           "update_weight_mode": "disk"})
    assert sglang.cluster.weight_sync_mode == "disk" and sglang.lora.lora_sync_from_tensor
    checked = build_config({**BASE, **LORA_ON, "lora_sync_from_tensor": True, "check_lora_weight_equal": True})
    assert checked.misc.check_lora_weight_equal
    ray = build_config({**BASE, **LORA_ON, "lora_sync_from_tensor": True, "check_lora_weight_equal": True, "runtime": "ray"})
    from miles_core.rollout.http.options import weight_sync

    sync = weight_sync(ray, "gloo")
    assert sync.lora_adapter and sync.check_adapter and sync.mode != "disk"  # the adapter goes as tensors, hashed
    sync.close()



def test_lora_base_cpu_backup_starts_our_servers_with_the_weights_cpu_backup():
    """Colocated adapter syncs with lora_base_cpu_backup: our server gets --enable-weights-cpu-backup (SGLang's flag;
    SGLang's launch: tests/rollout/sglang/test_passthrough.py)."""
    from miles_core.rollout.http.server import parse_args
    from miles_core.runtime.ray.engines import hf_server_args

    on = build_config({**BASE, **LORA_ON, "lora_base_cpu_backup": True, "lora_sync_from_tensor": True, "colocate": True,
                       "runtime": "ray"})
    assert parse_args(["--model-path", "m", *hf_server_args(on)]).enable_weights_cpu_backup is True
    off = build_config({**BASE, **LORA_ON, "lora_sync_from_tensor": True, "runtime": "ray"})
    assert not parse_args(["--model-path", "m", *hf_server_args(off)]).enable_weights_cpu_backup

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
    ({**LORA_ON, "lora_sync_from_tensor": True, "colocate": True}, "lora_sync_from_tensor with colocate"),
    ({**LORA_ON, "lora_sync_from_tensor": True, "rollout_engine": "sglang", "runtime": "ray"},
     "lora_sync_from_tensor with rollout_engine sglang"),
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

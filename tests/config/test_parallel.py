"""Parallelism / batching / offload fields (reference names and defaults) and their load-time rules."""

from __future__ import annotations

import json

import pytest

from miles_core.config import ConfigError
from miles_core.assemble import build_config
from miles_core.config import rules

BASE = {"rollout_batch_size": 4, "n_samples_per_prompt": 2, "prompt_data": "x.jsonl"}
RAY = {**BASE, "runtime": "ray", "train_backend": "megatron"}


def test_reference_defaults():
    p = build_config(BASE).parallel
    assert (p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size) == (1, 1, 1)
    assert (p.expert_model_parallel_size, p.expert_tensor_parallel_size, p.expert_tp) == (1, None, 1)
    assert not p.sequence_parallel and p.recompute_granularity is None and not p.use_distributed_optimizer
    assert not p.use_dynamic_batch_size and p.max_tokens_per_gpu is None and p.log_probs_max_tokens_per_gpu is None
    assert p.offload_train is None and p.offload_train_target == "cpu" and p.offload_train_disk_dir is None


@pytest.mark.parametrize("field, value", [("tensor_model_parallel_size", 2), ("sequence_parallel", True),
                                          ("use_dynamic_batch_size", True), ("expert_model_parallel_size", 2),
                                          ("use_distributed_optimizer", True), ("custom_megatron_init_path", "os.getcwd"),
                                          ("recompute_loss_function", True)])
def test_torch_backend_refuses_megatron_fields(field, value):
    with pytest.raises(ConfigError, match=f"{field}.*train_backend megatron only"):
        build_config({**BASE, field: value})


@pytest.mark.parametrize("values, match", [
    ({"offload_train_target": "disk"}, "offload_train_target disk is where offload_train parks .* offload_train is off"),
    ({"context_parallel_size": 2, "actor_num_gpus_per_node": 2}, "context_parallel_size 2 is not supported yet"),
    ({"sequence_parallel": True}, "sequence_parallel is not supported yet"),
    ({"recompute_granularity": "full"}, "needs recompute_method"),
    ({"recompute_method": "uniform"}, "apply only with recompute_granularity full"),
    ({"use_dynamic_batch_size": True}, "needs max_tokens_per_gpu"),
    ({"max_tokens_per_gpu": 64}, "apply only with use_dynamic_batch_size"),
    ({"megatron_to_hf_mode": "bridge"}, "megatron_to_hf_mode bridge converts with Megatron-Bridge .* set megatron_to_hf_mode: raw"),
    ({"qkv_format": "bshd", "use_dynamic_batch_size": True, "max_tokens_per_gpu": 64}, "qkv_format bshd pads .* drop one"),
    ({"use_opd": True, "opd_type": "sglang", "opd_teacher_load": "builtin://tiny-qwen2"},
     "opd_type sglang and opd_teacher_load .* not supported yet on train_backend megatron"),
])
def test_rules_name_the_fields(values, match):
    with pytest.raises(ConfigError, match=match):
        build_config({**RAY, **values})




def test_qkv_format_bshd_is_megatron_only_and_thd_is_the_default():
    assert build_config(BASE).parallel.qkv_format == "thd" and build_config(RAY).parallel.qkv_format == "thd"
    assert build_config({**RAY, "qkv_format": "bshd"}).parallel.qkv_format == "bshd"
    with pytest.raises(ConfigError, match="qkv_format bshd .* only supported with train_backend megatron"):
        build_config({**BASE, "qkv_format": "bshd"})


def test_megatron_takes_the_distributed_optimizer():
    assert build_config({**RAY, "use_distributed_optimizer": True, "actor_num_gpus_per_node": 2}).parallel.use_distributed_optimizer


def test_megatron_takes_the_ppo_critic():
    assert build_config({**RAY, "advantage_estimator": "ppo", "critic_lr": 1e-5}).algo.advantage_estimator == "ppo"


def test_megatron_takes_an_in_process_opd_teacher():
    a = build_config({**RAY, "use_opd": True, "opd_teacher_load": "builtin://tiny-qwen2"}).algo
    assert a.opd_type == "megatron" and a.opd_teacher_load == "builtin://tiny-qwen2"


def test_world_size_must_be_a_multiple_of_model_parallel():
    build_config({**RAY, "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "actor_num_gpus_per_node": 8})  # valid
    with pytest.raises(ConfigError, match=r"world size 6 .* = 4 \(world = TP \* PP \* CP \* DP\)"):
        build_config({**RAY, "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "actor_num_gpus_per_node": 6})
    with pytest.raises(ConfigError, match="expert_model_parallel_size"):
        build_config({**RAY, "expert_model_parallel_size": 4, "actor_num_gpus_per_node": 2})


def test_model_sizes_must_divide(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"num_attention_heads": 6, "num_key_value_heads": 2, "num_hidden_layers": 3, "num_experts": 4}))
    ok = {**RAY, "hf_checkpoint": str(tmp_path), "actor_num_gpus_per_node": 6}
    build_config({**ok, "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 3})  # the sizes divide
    with pytest.raises(ConfigError, match=r"tensor_model_parallel_size \(3\) must divide the model's num_key_value_heads \(2"):
        build_config({**ok, "tensor_model_parallel_size": 3})
    with pytest.raises(ConfigError, match=r"pipeline_model_parallel_size \(2\) must divide the model's num_hidden_layers \(3"):
        build_config({**ok, "pipeline_model_parallel_size": 2})
    with pytest.raises(ConfigError, match=r"expert_model_parallel_size \(3\) must divide the model's num_experts \(4"):
        build_config({**ok, "expert_model_parallel_size": 3})
    with pytest.raises(ConfigError, match="num_attention_heads"):  # builtin specs are read before they are built
        build_config({**RAY, "tensor_model_parallel_size": 8, "actor_num_gpus_per_node": 8})


def test_missing_or_old_megatron_core_names_the_install_command(monkeypatch):
    monkeypatch.setattr(rules, "_megatron_core_version", lambda: None)
    with pytest.raises(ConfigError, match=r"megatron-core >= 0.16.1 \(not installed\).*pip install 'megatron-core==0.16.1'"):
        build_config(RAY)
    monkeypatch.setattr(rules, "_megatron_core_version", lambda: (0, 15, 0))
    with pytest.raises(ConfigError, match=r"\(version 0.15.0\)"):
        build_config(RAY)


def test_installed_megatron_core_is_new_enough():
    assert rules._megatron_core_version() >= rules.MEGATRON_CORE_MIN


@pytest.mark.parametrize("values, on, rollout", [
    ({}, False, False), ({"colocate": True}, True, True), ({"offload": True}, True, True), ({"offload_train": True}, True, False),
    ({"colocate": True, "offload_train": False}, False, True), ({"colocate": True, "debug_rollout_only": True}, False, True),
])
def test_offload_train_defaults_to_colocate_or_offload_as_in_the_reference(values, on, rollout):
    """The reference's arguments.py: offload_train None -> True with --colocate or --offload, else False (and off with
    debug_rollout_only); offload also turns offload_rollout on."""
    c = build_config({**RAY, **values})
    assert c.offloads_trainer is on and bool(c.cluster.rollout_offload_tags) is rollout


@pytest.mark.parametrize("values, match", [
    ({"offload_train": True, "async_mode": "one_step"}, "offload_train moves the trainer .* async_mode one_step"),
    ({"offload": True, "async_mode": "fully"}, "offload moves the trainer .* async_mode fully"),
    ({"offload_train": True, "debug_rollout_only": True}, "offload_train with debug_rollout_only: there is no train stage"),
    ({"offload_train": True, "debug_train_only": True, "load_debug_rollout_data": "r/{rollout_id}.pt"},
     "offload_train with debug_train_only: there are no engines"),
    ({"offload": True, "offload_train": False}, "offload sets offload_train and offload_rollout, but offload_train is false"),
    ({"offload": True, "offload_rollout": False}, "offload sets .* but offload_rollout is false"),
])
def test_offload_train_is_refused_where_nothing_alternates_with_the_trainer(values, match):
    with pytest.raises(ConfigError, match=match):
        build_config({**RAY, **values})


def test_offload_on_the_local_runtime_is_refused_but_offload_train_alone_is_not():
    with pytest.raises(ConfigError, match=r"offload_rollout / offload_rollout_level / offload release .* \(offload_train alone"):
        build_config({**BASE, "offload": True})
    assert build_config({**BASE, "offload_train": True}).offloads_trainer


def test_critic_dirs_default_beside_the_actors_and_are_refused_where_no_critic_saves_there(tmp_path):
    """critic_save / critic_load: <save>_critic and <load>_critic by default (the reference's arguments.py); only the
    torch trainer's ppo critic has a dir of its own."""
    ppo = {**BASE, "advantage_estimator": "ppo", "save": str(tmp_path / "ck")}
    c = build_config(ppo)
    assert c.critic_save_dir == tmp_path / "ck_critic" and c.critic_load_dir == tmp_path / "ck_critic"
    c = build_config({**ppo, "load": str(tmp_path / "old"), "critic_save": str(tmp_path / "v")})
    assert c.critic_save_dir == tmp_path / "v" and c.critic_load_dir == tmp_path / "old_critic"
    with pytest.raises(ConfigError, match="critic_save is the ppo critic's checkpoint dir; advantage_estimator grpo"):
        build_config({**BASE, "critic_save": "x"})
    with pytest.raises(ConfigError, match="critic_load is not supported yet with train_backend megatron"):
        build_config({**RAY, "advantage_estimator": "ppo", "critic_load": "x"})
    with pytest.raises(ConfigError, match="critic_save .* is the actor's save dir"):
        build_config({**ppo, "critic_save": str(tmp_path / "ck")})


def test_async_save_is_the_torch_trainers():
    assert build_config({**BASE, "async_save": True}).checkpoint.async_save
    with pytest.raises(ConfigError, match="async_save is not supported yet with train_backend megatron"):
        build_config({**RAY, "async_save": True})


REMAT = {**RAY, "dtype": "bfloat16", "offload_train": True, "rematerialize_param_from_master_weight": True}


def test_rematerialize_param_from_master_weight_defaults_off_and_loads_on_megatron_in_16_bit():
    p = build_config(BASE).parallel
    assert p.rematerialize_param_from_master_weight is False and p.check_rematerialize_param_from_master_weight is False
    for dtype in ("bfloat16", "float16"):
        p = build_config({**REMAT, "dtype": dtype, "check_rematerialize_param_from_master_weight": True}).parallel
        assert p.rematerialize_param_from_master_weight and p.check_rematerialize_param_from_master_weight
    assert build_config({**REMAT, "offload_train": None, "colocate": True}).offloads_trainer  # colocate turns it on


@pytest.mark.parametrize("values, match", [
    ({"offload_train": None}, "rematerialize_param_from_master_weight rebuilds the weights offload_train dropped, but "
                              "offload_train is off"),
    ({"offload_train": False, "colocate": True}, "rematerialize_param_from_master_weight .* offload_train is off"),
    ({"train_backend": "torch"}, "rematerialize_param_from_master_weight is not supported with train_backend torch: its "
                                 "parameters are the fp32 weights"),
    ({"dtype": "float32"}, "rematerialize_param_from_master_weight is not supported with dtype float32"),
    ({"lora_rank": 4}, "rematerialize_param_from_master_weight with lora_rank > 0 is not supported yet"),
    ({"rematerialize_param_from_master_weight": False, "check_rematerialize_param_from_master_weight": True},
     "check_rematerialize_param_from_master_weight checks rematerialize_param_from_master_weight, which is off"),
])
def test_rematerialize_param_from_master_weight_is_refused_where_there_is_nothing_to_rebuild(values, match):
    with pytest.raises(ConfigError, match=match):
        build_config({**REMAT, **values})

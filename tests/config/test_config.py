"""Config: reference names and defaults, frozen, unknown keys rejected, cross-field rules explained."""

from __future__ import annotations

import pytest

from miles_core.config import GROUPS, ConfigError, field_groups
from flows.recipes import list_recipes, load_config
from miles_core.assemble import build_config

BASE = {"rollout_batch_size": 4, "n_samples_per_prompt": 2, "prompt_data": "x.jsonl"}


def test_field_names_unique_across_groups():
    names = [n for m in GROUPS.values() for n in m.model_fields]
    assert len(names) == len(set(names))
    assert len(field_groups()) == len(names)


def test_reference_defaults():
    cfg = build_config(BASE)
    assert cfg.algo.eps_clip == 0.2 and cfg.algo.eps_clip_high is None
    assert cfg.algo.kl_loss_type == "k1" and cfg.algo.advantage_estimator == "grpo"
    assert cfg.data.rollout_seed == 42 and cfg.data.input_key == "input" and cfg.data.metadata_key == "metadata"
    assert cfg.rollout.rollout_top_k == -1
    assert cfg.algo.tis_clip == 2.0 and cfg.algo.tis_clip_low == 0.0
    assert cfg.cluster.update_weight_buffer_size == 512 * 1024**2
    assert cfg.eval.eval_max_in_flight == 2


def test_derived_batch_values():
    cfg = build_config({**BASE, "num_steps_per_rollout": 2})
    assert (cfg.global_batch_size, cfg.num_steps_per_rollout) == (4, 2)  # 4 * 2 = 8 = 4 * 2
    cfg = build_config({**BASE, "global_batch_size": 2})
    assert (cfg.global_batch_size, cfg.num_steps_per_rollout) == (2, 4)
    cfg = build_config(BASE)
    assert (cfg.global_batch_size, cfg.num_steps_per_rollout) == (8, 1)


def test_frozen():
    cfg = build_config(BASE)
    with pytest.raises(Exception):
        cfg.algo.lr = 1.0  # type: ignore[misc]


def test_unknown_key_named_with_suggestion():
    with pytest.raises(ConfigError, match=r"unknown config key 'rollout_batch_sise'.*rollout_batch_size"):
        build_config({**BASE, "rollout_batch_sise": 3})


def test_batch_invariant_names_fields():
    with pytest.raises(ConfigError) as e:
        build_config({**BASE, "global_batch_size": 3, "num_steps_per_rollout": 2})
    msg = str(e.value)
    for field in ("rollout_batch_size", "n_samples_per_prompt", "global_batch_size", "num_steps_per_rollout"):
        assert field in msg
    with pytest.raises(ConfigError, match="not divisible by num_steps_per_rollout"):
        build_config({**BASE, "num_steps_per_rollout": 3})


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        ({"use_tis": True, "use_rollout_logprobs": True}, "mutually exclusive"),
        ({"advantage_estimator": "reinforce_plus_plus"}, "normalize_advantages"),
        ({"advantage_estimator": "nope"}, "advantage_estimator"),
        ({"rm_type": "nope"}, "unknown rm_type 'nope'"),
        ({"rm_type": "remote_rm"}, "rm_url"),
        ({"kl_coef": 0.1}, "kl_coef"),
        ({"loss_type": "custom_loss"}, "custom_loss_function_path"),
        ({"over_sampling_batch_size": 2}, "over_sampling_batch_size"),
        ({"eval_prompt_data": ["a"]}, "name path pairs"),
        ({"runtime": "local", "rollout_engine": "sglang"}, "runtime local"),
        ({"rollout_batch_size": 0}, "rollout_batch_size"),
        ({"use_opd": True}, "opd_teacher_load"),
        ({"update_weight_mode": "broadcast"}, "needs runtime ray"),
        ({"runtime": "ray", "ft_components": ["train"]}, "ft_components"),
        ({"max_weight_staleness": 1}, "max_weight_staleness applies only with async_mode fully"),
        ({"async_mode": "one_step", "max_weight_staleness": 1}, "one_step is stale by at most one"),
        ({"update_weights_interval": 2}, "update_weights_interval applies only"),
        ({"async_mode": "fully", "partial_rollout": True}, "partial_rollout does not combine"),
        ({"async_mode": "one_step", "update_weights_interval": 2, "save_interval": 3}, r"save_interval \(3\) must be a multiple"),
        ({"async_mode": "fully", "fully_async_buffer_groups": 1, "rollout_batch_size": 2}, "fully_async_buffer_groups"),
        ({"async_max_concurrent_samples": 4}, "async_max_concurrent_samples applies only with async_mode fully"),
        ({"async_unused_samples_handler": "retry"}, "async_unused_samples_handler applies only with async_mode fully"),
        ({"async_mode": "fully", "stale_group_policy": "drop", "async_unused_samples_handler": "retry"}, "set one"),
        ({"async_mode": "one_step", "async_data_buffer_capacity_factor": 3.0}, "async_data_buffer_capacity_factor apply only"),
        ({"async_mode": "fully", "fully_async_buffer_groups": 4, "async_data_buffer_capacity_factor": 3.0}, "set one"),
        ({"async_mode": "fully", "async_data_buffer_capacity_factor": 0.1, "rollout_batch_size": 2}, "leaves a buffer of 0 groups"),
        ({"async_mode": "sometimes"}, "async_mode"),
        ({"start_rollout_id": 1, "async_mode": "one_step"}, "start_rollout_id with async_mode one_step is not supported yet"),
        ({"start_rollout_id": 3, "num_rollout": 3}, r"start_rollout_id \(3\) must be below num_rollout \(3\)"),
        ({"runtime": "ray", "train_backend": "megatron", "balance_by_flops": True}, "balance_by_flops balances the packed"),
        ({"balance_by_flops": True}, r"balance_by_flops \(True\) is read by train_backend megatron only"),
        ({"model_name": "qwen2"}, "model_name .* picks the Megatron trainer's HF <-> Megatron tensor mapping"),
        ({"padded_vocab_size": 512}, r"padded_vocab_size \(512\) is read by train_backend megatron only"),
        ({"runtime": "ray", "train_backend": "megatron", "tensor_model_parallel_size": 2, "padded_vocab_size": 513},
         r"padded_vocab_size \(513\) must be a multiple of tensor_model_parallel_size \(2\)"),
        ({"runtime": "ray", "train_backend": "megatron", "model_name": "gpt2"}, "model_name 'gpt2' names no converter of a model family"),
        ({"wandb_always_use_train_step": True}, "wandb_always_use_train_step sets the steps of the W&B mirror, which is off"),
        ({"wandb_always_use_train_step": True, "use_wandb": True, "debug_skip_weight_update": True},
         "wandb_always_use_train_step with debug_skip_weight_update"),
        ({"wandb_always_use_train_step": True, "use_wandb": True, "async_mode": "one_step", "update_weights_interval": 2},
         "wandb_always_use_train_step with update_weights_interval 2"),
        ({"log_correct_samples": True, "skip_actor_forward_only": True}, "log_correct_samples with skip_actor_forward_only"),
        ({"log_correct_samples": True, "disable_compute_advantages_and_returns": True, "loss_type": "sft_loss"},
         "log_correct_samples with disable_compute_advantages_and_returns"),
        ({"async_mode": "one_step", "runtime": "ray", "colocate": True}, "needs disaggregated engines"),
        ({"runtime": "ray", "rollout_engine": "sglang", "colocate": True, "update_weight_mode": "tensor"}, "CUDA-IPC"),
        ({"runtime": "ray", "rollout_engine": "sglang", "update_weight_mode": "tensor"}, "update_weight_mode tensor"),
    ],
)
def test_cross_field_rules(extra, pattern):
    with pytest.raises(ConfigError, match=pattern):
        build_config({**BASE, **extra})


def test_missing_required_field_named():
    with pytest.raises(ConfigError, match="rollout_batch_size"):
        build_config({"prompt_data": "x.jsonl"})


def test_grouped_recipe_form_accepted():
    cfg = build_config({"rollout": {"rollout_batch_size": 4, "n_samples_per_prompt": 2}, "data": {"prompt_data": "x.jsonl"}, "lr": 1e-5})
    assert cfg.rollout.rollout_batch_size == 4 and cfg.algo.lr == 1e-5


@pytest.mark.parametrize("recipe", list_recipes())
def test_every_shipped_recipe_validates(recipe):
    cfg = load_config(recipe)
    assert cfg.misc.recipe == recipe


def test_overrides_apply_over_recipe():
    cfg = load_config("tiny", {"rollout-batch-size": 4, "num_rollout": 2})
    assert cfg.rollout.rollout_batch_size == 4 and cfg.rollout.num_rollout == 2


def test_unknown_recipe_lists_valid():
    with pytest.raises(ConfigError, match="tiny"):
        load_config("no-such-recipe")


def test_bad_yaml_recipe_names_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("rollout_batch_size: [1,\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_config(str(p))


def test_yaml_off_is_the_off_choice_not_false(tmp_path):
    """YAML reads a bare `off` as False: for a choice field it still means the choice "off"."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("extends: tiny\nasync_mode: off\n")
    assert load_config(str(recipe)).rollout.async_mode == "off"
    assert build_config({**BASE, "async_mode": False}).rollout.async_mode == "off"
    with pytest.raises(ConfigError, match="async_mode"):
        build_config({**BASE, "async_mode": True})  # no "on" choice: still an error


@pytest.mark.parametrize(("extra", "mode"), [
    ({}, "tensor"),  # local: in-process copy
    ({"runtime": "ray"}, "broadcast"),  # disaggregated
    ({"runtime": "ray", "colocate": True}, "tensor"),
    ({"runtime": "ray", "update_weight_mode": "disk"}, "disk"),
    ({"runtime": "ray", "colocate": True, "rollout_engine": "sglang"}, "disk"),  # SGLang's tensor route needs CUDA-IPC handles
])
def test_weight_sync_mode_default(extra, mode):
    """update_weight_mode None: tensor when colocated (or local; disk for colocated SGLang), broadcast when disaggregated."""
    assert build_config({**BASE, **extra}).cluster.weight_sync_mode == mode


def test_train_env_vars_are_the_ray_train_actors_and_refused_on_the_local_runtime():
    assert build_config(BASE).cluster.train_env_vars == {}  # the reference's default '{}'
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert build_config({**BASE, "runtime": "ray", "train_env_vars": env}).cluster.train_env_vars == env
    with pytest.raises(ConfigError, match="train_env_vars \\(PYTORCH_CUDA_ALLOC_CONF\\) .* the local runtime trains in this process"):
        build_config({**BASE, "train_env_vars": env})


@pytest.mark.parametrize(("over", "match"), [
    ({"disable_compute_advantages_and_returns": True}, "disable_compute_advantages_and_returns .* loss_type policy_loss"),
    ({"disable_compute_advantages_and_returns": True, "loss_type": "sft_loss", "use_kl_loss": True, "kl_loss_coef": 0.1},
     "disable_compute_advantages_and_returns .* a KL term"),
    ({"skip_actor_forward_only": True, "num_steps_per_rollout": 2}, "skip_actor_forward_only with num_steps_per_rollout 2"),
    ({"skip_actor_forward_only": True, "loss_type": "sft_loss"}, "skip_actor_forward_only with loss_type sft_loss"),
    ({"use_rollout_entropy": True, "use_rollout_logprobs": True}, "use_rollout_entropy .* which use_rollout_logprobs skips"),
])
def test_skipped_forward_passes_refuse_what_needs_them(over, match):
    from miles_core.assemble import build_config

    base = {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "prompt_data": "builtin://arith"}
    build_config({**base, "disable_compute_advantages_and_returns": True, "loss_type": "sft_loss"})
    build_config({**base, "skip_actor_forward_only": True})
    build_config({**base, "use_rollout_entropy": True})
    with pytest.raises(ConfigError, match=match):
        build_config({**base, **over})

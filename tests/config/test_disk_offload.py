"""The disk offload fields (reference names and defaults) and their load-time rules (config/rules_disk.py): each
refusal names the field."""

from __future__ import annotations

import pytest

from miles_core.assemble import build_config
from miles_core.config import ConfigError

BASE = {"rollout_batch_size": 4, "n_samples_per_prompt": 2, "prompt_data": "x.jsonl"}
DISK = {**BASE, "offload_train": True, "offload_train_target": "disk"}
STREAM = {**BASE, "stream_optimizer_state_to_disk": True}


def test_reference_defaults_and_the_default_dir(tmp_path):
    c = build_config({**BASE, "run_dir": str(tmp_path)})
    p = c.parallel
    assert (p.offload_train_target, p.offload_train_disk_dir, p.offload_train_disk_chunk_mb) == ("cpu", None, 256)
    assert (p.stream_optimizer_state_to_disk, p.stream_optimizer_state_moment_dtype) == (False, "fp32")
    assert c.offload_disk_dir == tmp_path / "train_offload"
    assert build_config({**DISK, "offload_train_disk_dir": "park"}).offload_disk_dir.name == "park"
    for dtype in ("fp32", "bf16", "fp16", "fp8e4m3", "fp8e5m2"):  # the reference's choices
        build_config({**STREAM, "stream_optimizer_state_moment_dtype": dtype})
    build_config({**STREAM, **DISK, "offload_train_disk_chunk_mb": 1})  # streaming with the trainer parked on disk


@pytest.mark.parametrize("values, match", [
    ({**BASE, "offload_train_target": "disk"}, "offload_train_target disk is where offload_train parks .* offload_train "
                                               "is off"),
    ({**DISK, "offload_train_disk_chunk_mb": 0}, "offload_train_disk_chunk_mb"),
    ({**BASE, "offload_train_disk_dir": "/tmp/x"}, "offload_train_disk_dir '/tmp/x' applies only with "
                                                   "offload_train_target disk or stream_optimizer_state_to_disk"),
    ({**BASE, "offload_train_disk_chunk_mb": 64}, "offload_train_disk_chunk_mb 64 applies only with"),
    ({**BASE, "stream_optimizer_state_moment_dtype": "bf16"}, "stream_optimizer_state_moment_dtype 'bf16' applies only "
                                                              "with stream_optimizer_state_to_disk"),
    ({**STREAM, "stream_optimizer_state_moment_dtype": "int8"}, "stream_optimizer_state_moment_dtype"),
    ({**STREAM, "offload_train": True}, "stream_optimizer_state_to_disk with offload_train requires offload_train_target "
                                        "disk"),
    ({**STREAM, "runtime": "ray", "train_backend": "megatron"}, "stream_optimizer_state_to_disk is not supported yet "
                                                                "with train_backend megatron"),
    ({**STREAM, "runtime": "ray", "actor_num_gpus_per_node": 2}, "stream_optimizer_state_to_disk is not supported yet "
                                                                 "with data parallel"),
    ({**STREAM, "lora_rank": 4}, "stream_optimizer_state_to_disk with lora_rank > 0 is not supported"),
    ({**STREAM, "reset_optimizer_states": True}, "stream_optimizer_state_to_disk with reset_optimizer_states is not"),
    ({**DISK, "rematerialize_param_from_master_weight": True, "runtime": "ray", "train_backend": "megatron",
      "dtype": "bfloat16"}, "rematerialize_param_from_master_weight with offload_train_target disk is not supported"),
    ({**STREAM, "run_dir": "r", "offload_train_disk_dir": "r/checkpoints/park"}, "offload_train_disk_dir .* overlaps the "
                                                                                 "checkpoint save dir"),
    ({**DISK, "offload_train_disk_dir": "ck", "load": "ck/run"}, "offload_train_disk_dir .* overlaps the checkpoint "
                                                                "load dir"),
])
def test_refusals_name_the_field(values, match):
    with pytest.raises(ConfigError, match=match):
        build_config(values)

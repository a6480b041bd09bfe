"""Disk weight sync: the trainer writes an HF dir (model.safetensors + config.json) atomically; engines
load it with POST /update_weights_from_disk {model_path}. With lora_sync_from_tensor the trainer writes the PEFT
adapter dir alone (adapter_config.json + adapter_model.safetensors, save_adapter_dir); engines load it with SGLang's
POST /load_lora_adapter {lora_name, lora_path}.

Atomic: the files are written into ``.<name>.tmp-<pid>`` next to the target, then the directory is
renamed; an engine never sees a half-written dir.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Iterable

import torch


def _atomic_dir(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def _publish(tmp: Path, path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return path


def save_hf_weights(named: list[tuple[str, torch.Tensor]], path: str | Path, hf_config=None) -> Path:
    """Write ``named`` as <path>/model.safetensors (+ config.json when ``hf_config``). -> path."""
    from safetensors.torch import save_file

    path = Path(path)
    tmp = _atomic_dir(path)
    # clones: safetensors refuses tensors that share storage (tied embeddings)
    save_file({n: t.detach().cpu().contiguous().clone() for n, t in named}, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    if hf_config is not None:
        hf_config.save_pretrained(tmp)
    return _publish(tmp, path)


ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"  # PEFT's file names


def save_adapter_dir(config: dict, named: list[tuple[str, torch.Tensor]], path: str | Path) -> Path:
    """A PEFT adapter dir at ``path``: ``config`` as adapter_config.json, ``named`` (adapter_model.safetensors' names,
    ``base_model.model.<module>.lora_{A,B}.weight``) as adapter_model.safetensors; atomic. -> path."""
    from safetensors.torch import save_file

    path = Path(path)
    tmp = _atomic_dir(path)
    save_file({n: t.detach().cpu().contiguous().clone() for n, t in named}, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))
    return _publish(tmp, path)


def tensor_sha256(t: torch.Tensor) -> str:
    """sha256 of a tensor's bytes in its own dtype, row-major: the reference's check_lora_weight_equal digest
    (miles/backends/megatron_utils/update_weight/update_weight_from_tensor.py, _send_to_colocated_engine)."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()


def adapter_checksums(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, str]:
    """{name: tensor_sha256}: SGLang's ``expected_checksums`` of /load_lora_adapter_from_tensors; also the trainer's
    digests of a whole sync (save_local_weight_checksum)."""
    return {n: tensor_sha256(t) for n, t in named}

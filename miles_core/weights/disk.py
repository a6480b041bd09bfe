"""Disk weight sync: the trainer writes an HF dir (model.safetensors + config.json) atomically; engines
load it with POST /update_weights_from_disk {model_path}.

Atomic: the files are written into ``.<name>.tmp-<pid>`` next to the target, then the directory is
renamed; an engine never sees a half-written dir.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch


def save_hf_weights(named: list[tuple[str, torch.Tensor]], path: str | Path, hf_config=None) -> Path:
    """Write ``named`` as <path>/model.safetensors (+ config.json when ``hf_config``). -> path."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    # clones: safetensors refuses tensors that share storage (tied embeddings)
    save_file({n: t.detach().cpu().contiguous().clone() for n, t in named}, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    if hf_config is not None:
        hf_config.save_pretrained(tmp)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return path

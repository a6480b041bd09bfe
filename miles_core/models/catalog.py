"""Every builtin:// model by name -> its builder: the tiny models (builtin.py), the GLM-4.5-architecture debug
models (glm.py) and the tiny tool-calling models (tiny_tools.py). Its own module: the builders import
builtin.py's helpers, so the table that names them all lives above them."""

from __future__ import annotations

from pathlib import Path

from .builtin import BUILTIN_MODELS, build_tiny


def _catalog() -> tuple[dict, dict]:
    """(name -> spec, name -> builder) of every builtin model."""
    from .glm import GLM_MODELS, build_glm_debug  # imported on use: each builder pulls in its own training data
    from .tiny_tools import TOOL_MODELS, build_tiny_tools

    builders = {**{n: build_tiny for n in BUILTIN_MODELS}, **{n: build_glm_debug for n in GLM_MODELS},
                **{n: build_tiny_tools for n in TOOL_MODELS}}
    return {**BUILTIN_MODELS, **GLM_MODELS, **TOOL_MODELS}, builders


def builtin_model_dir(name: str, cache_dir: Path) -> Path:
    """Where builtin model ``name`` is built under ``cache_dir`` (keyed by its spec's fingerprint), built or not."""
    specs, _ = _catalog()
    if name not in specs:
        raise ValueError(f"unknown builtin model {name!r}; valid: {sorted(specs)}")
    return cache_dir / "models" / f"{name}-{specs[name].fingerprint()}"


def builtin_model_path(name: str, cache_dir: Path) -> Path:
    """The local dir of builtin model ``name`` under ``cache_dir`` (built once, keyed by its spec's fingerprint)."""
    out = builtin_model_dir(name, cache_dir)
    if not (out / "config.json").exists():
        specs, builders = _catalog()
        out.parent.mkdir(parents=True, exist_ok=True)
        builders[name](specs[name], out)
    return out

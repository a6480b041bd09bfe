"""Every builtin:// model by name -> its builder: the tiny models (builtin.py), the GLM-4.5-architecture debug
models (glm.py) and the tiny tool-calling models (tiny_tools.py). Its own module: the builders import
builtin.py's helpers, so the table that names them all lives above them."""

from __future__ import annotations

from pathlib import Path

from .builtin import BUILTIN_MODELS, build_tiny


def builtin_model_path(name: str, cache_dir: Path) -> Path:
    """The local dir of builtin model ``name`` under ``cache_dir`` (built once, keyed by its spec's fingerprint)."""
    from .glm import GLM_MODELS, build_glm_debug  # imported on use: each builder pulls in its own training data
    from .tiny_tools import TOOL_MODELS, build_tiny_tools

    builders = {**{n: build_tiny for n in BUILTIN_MODELS}, **{n: build_glm_debug for n in GLM_MODELS},
                **{n: build_tiny_tools for n in TOOL_MODELS}}
    if name not in builders:
        raise ValueError(f"unknown builtin model {name!r}; valid: {sorted(builders)}")
    spec = {**BUILTIN_MODELS, **GLM_MODELS, **TOOL_MODELS}[name]
    out = cache_dir / "models" / f"{name}-{spec.fingerprint()}"
    if not (out / "config.json").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        builders[name](spec, out)
    return out

"""Where the library (and the libraries it drives) may write, and its telemetry off.

``configure_library_environment()`` sets the library's defaults: caches and homes under the project
(``.cache/``), telemetry off, the hub offline unless the user opts in with MILES_ALLOW_HUB=1. A miles
process calls flows/env.py's ``configure_environment()`` (these plus Prefect's settings, which belong
with the flows); a process of the library alone (the engine server) calls this one.
"""

from __future__ import annotations

import os
from pathlib import Path


CACHE_DIR_ENV = "MILES_CACHE_DIR"  # a directory (read as a path)
ALLOW_HUB_ENV = "MILES_ALLOW_HUB"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_DIR_ENV, Path.cwd() / ".cache" / "miles")).absolute()


def allow_hub(text: str) -> bool:
    """MILES_ALLOW_HUB's value: 1 lets transformers download from the hub; unset, empty or 0 keeps it offline.
    Anything else raises ValueError (``true`` would otherwise silently leave the hub offline)."""
    if text not in ("", "0", "1"):
        raise ValueError(f"{ALLOW_HUB_ENV}={text!r}: expected 1 (download from the hub) or 0 (offline, the default)")
    return text == "1"


def configure_library_environment() -> None:
    """Idempotent; never overrides a value the user set. A value of MILES_ALLOW_HUB other than 0 or 1 raises ValueError."""
    home = cache_dir().parent
    defaults = {
        "HF_HOME": str(home / "huggingface"),
        "RAY_TMPDIR": str(Path("/tmp") / f"ray-miles-{os.getuid()}"),
        "MPLCONFIGDIR": str(home / "matplotlib"),
        "TORCHINDUCTOR_CACHE_DIR": str(home / "torchinductor"),  # torch.compile's kernels (else /tmp/torchinductor_<user>)
        "TRITON_CACHE_DIR": str(home / "triton"),
        "DO_NOT_TRACK": "true",
        "MLFLOW_ENABLE_TELEMETRY": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_LOGGING_LEVEL": "WARNING",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_OFFLINE": "0" if allow_hub(os.environ.get(ALLOW_HUB_ENV, "")) else "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_USAGE_STATS_ENABLED": "0",
        # W&B (use_wandb): its homes inside the project, no error reports sent, no console banner
        "WANDB_CACHE_DIR": str(home / "wandb" / "cache"),
        "WANDB_CONFIG_DIR": str(home / "wandb" / "config"),
        "WANDB_DATA_DIR": str(home / "wandb" / "data"),
        "WANDB_ARTIFACT_DIR": str(home / "wandb" / "artifacts"),
        "WANDB_ERROR_REPORTING": "false",
        "WANDB_SILENT": "true",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)

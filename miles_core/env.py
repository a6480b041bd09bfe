"""Every place miles (and the libraries it drives) may write, set in one place.

Called by the CLI and the flows package before Prefect, MLflow, Ray or transformers are imported:
caches and homes live under the project (``.cache/``), telemetry is off, the hub is offline
unless the user opts in with MILES_ALLOW_HUB=1.
"""

from __future__ import annotations

import os
from pathlib import Path

# Settings for the ephemeral Prefect API only: it serves this one process (no UI, no other client), so
# the consumers that only a UI or automations read are off. `miles serve` starts its long-lived server
# without them (flows/serve.py); with PREFECT_API_URL set they have no effect (they are server settings).
EPHEMERAL_API_ONLY = ("PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED", "PREFECT_SERVER_EVENTS_STREAM_OUT_ENABLED",
                      "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED")


def cache_dir() -> Path:
    return Path(os.environ.get("MILES_CACHE_DIR", Path.cwd() / ".cache" / "miles")).absolute()


def configure_environment() -> None:
    """Idempotent; never overrides a value the user set."""
    home = cache_dir().parent
    defaults = {
        "PREFECT_HOME": str(home / "prefect"),
        "HF_HOME": str(home / "huggingface"),
        "RAY_TMPDIR": str(Path("/tmp") / f"ray-miles-{os.getuid()}"),
        "MPLCONFIGDIR": str(home / "matplotlib"),
        "TORCHINDUCTOR_CACHE_DIR": str(home / "torchinductor"),  # torch.compile's kernels (else /tmp/torchinductor_<user>)
        "TRITON_CACHE_DIR": str(home / "triton"),
        "DO_NOT_TRACK": "true",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY": "false",
        "MLFLOW_ENABLE_TELEMETRY": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_LOGGING_LEVEL": "WARNING",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_OFFLINE": "0" if os.environ.get("MILES_ALLOW_HUB") == "1" else "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_USAGE_STATS_ENABLED": "0",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
        "PREFECT_LOGGING_TO_API_ENABLED": "true",
        "PREFECT_LOGGING_EXTRA_LOGGERS": "miles_core,miles",  # library warnings inside a run reach its Prefect logs
        "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",  # outside a run they go to the console only
        "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "50",
        "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE": "50",
        "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
        "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false",
        "PREFECT_SERVER_EVENTS_STREAM_OUT_ENABLED": "false",
        # the events table feeds the UI's event feed and automations only; task runs, their states, logs and
        # artifacts are recorded without it. Off, the ephemeral API spends half the CPU per task run.
        "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED": "false",
        "PREFECT_LOCAL_STORAGE_PATH": str(home / "prefect" / "storage"),
        # W&B (use_wandb): its homes inside the project, no error reports sent, no console banner
        "WANDB_CACHE_DIR": str(home / "wandb" / "cache"),
        "WANDB_CONFIG_DIR": str(home / "wandb" / "config"),
        "WANDB_DATA_DIR": str(home / "wandb" / "data"),
        "WANDB_ARTIFACT_DIR": str(home / "wandb" / "artifacts"),
        "WANDB_ERROR_REPORTING": "false",
        "WANDB_SILENT": "true",
    }
    ours = "PREFECT_HOME" not in os.environ
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    if ours:  # Prefect creates its home without parents when first imported: make the chain here
        Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)


def long_lived_server_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a Prefect server that outlives this process (``miles serve``): without the
    ephemeral-API settings miles defaults to, so automations and the UI's live event feed work there."""
    return {k: v for k, v in env.items() if not (k in EPHEMERAL_API_ONLY and v == "false")}

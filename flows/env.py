"""The one place a miles process sets its environment, before Prefect, MLflow, Ray or transformers are
imported (``import flows`` runs it; so do the CLI, the tools and the test suite).

``configure_environment()`` = the library's defaults (miles_core/env.py: caches and homes under the project,
telemetry off, the hub offline) + Prefect's settings, which belong with the flows: its home and local
storage under the project, telemetry off, logging, and the ephemeral API's tuning. Nothing is written
outside the project dir or a run dir. A value the user set always wins.
"""

from __future__ import annotations

import os
from pathlib import Path

from miles_core.env import cache_dir, configure_library_environment

# Settings for the ephemeral Prefect API only: it serves this one process (no UI, no other client), so
# the consumers that only a UI or automations read are off. `miles serve` starts its long-lived server
# without them (flows/serve.py); with PREFECT_API_URL set they have no effect (they are server settings).
EPHEMERAL_API_ONLY = ("PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED", "PREFECT_SERVER_EVENTS_STREAM_OUT_ENABLED",
                      "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED")


def configure_environment() -> None:
    """Idempotent; never overrides a value the user set. A value of MILES_ALLOW_HUB other than 0 or 1 raises ValueError."""
    configure_library_environment()
    home = cache_dir().parent
    defaults = {
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY": "false",
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

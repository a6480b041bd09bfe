"""The run's readable log lines (logger ``miles.run``: miles_core/tracking/runlog.py and the
checkpoint/export tasks) go to the Prefect API as the flow run's logs, at INFO, and not to the console
(the CLI shows its progress bar; miles' default Prefect level is WARNING)."""

from __future__ import annotations

import logging

from miles_core.tracking.runlog import RUN_LOG


def attach_prefect_logs() -> logging.Logger:
    """Idempotent: ``miles.run`` at INFO with Prefect's API handler only."""
    from prefect.logging.handlers import APILogHandler

    logger = logging.getLogger(RUN_LOG)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    if not any(isinstance(h, APILogHandler) for h in logger.handlers):
        logger.addHandler(APILogHandler())
    return logger


def flush_prefect_logs() -> None:
    """Send the log lines queued for the Prefect API now (they are batched in the background)."""
    from prefect.logging.handlers import APILogHandler

    for handler in logging.getLogger(RUN_LOG).handlers:
        if isinstance(handler, APILogHandler):
            handler.flush()

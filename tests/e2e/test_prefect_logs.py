"""Library warnings raised inside a flow run land in that run's Prefect logs (the UI's log tab), not
only on the console: miles_core and miles are Prefect extra loggers (flows/env.py)."""

from __future__ import annotations

import asyncio
import logging
import os

import pytest
from prefect import flow, get_client, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.context import get_run_context
from prefect.logging.handlers import APILogHandler


@task(cache_policy=NO_CACHE)
def _skipping_eval() -> None:
    logging.getLogger("miles_core.evaluation.point").warning("eval at step %d skipped: %s", 3, "no_checkpoint")


@flow
def _flow_with_a_library_warning() -> str:
    _skipping_eval()
    return str(get_run_context().flow_run.id)


async def _logs(flow_run_id: str) -> list[tuple[str, int, str]]:
    async with get_client() as client:
        logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return [(entry.name, entry.level, entry.message) for entry in logs]


@pytest.mark.usefixtures("prefect_harness")
def test_a_library_warning_lands_in_the_flow_runs_prefect_logs():
    assert "miles_core" in os.environ["PREFECT_LOGGING_EXTRA_LOGGERS"].split(",")
    flow_run_id = _flow_with_a_library_warning()
    APILogHandler().flush()
    logs = []
    for _ in range(20):  # the log worker ships batches in the background
        logs = asyncio.run(_logs(flow_run_id))
        if logs:
            break
        asyncio.run(asyncio.sleep(0.5))
    assert ("miles_core.evaluation.point", logging.WARNING, "eval at step 3 skipped: no_checkpoint") in logs, logs

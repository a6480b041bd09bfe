"""Run the train flow from the CLI with a progress bar and a readable summary."""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING, NoReturn

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from miles_core.config import TrainConfig
from miles_core.tracking import progress

if TYPE_CHECKING:
    from flows.interrupt import OwnSessionAPI


def _quiet_libraries() -> None:
    for name in ("prefect", "mlflow", "alembic", "httpx", "uvicorn", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    _no_prefect_tracebacks_on_console()


class _DropPrefectErrors(logging.Filter):
    """Prefect's own error records (a failed task or flow run, with its traceback): the CLI prints one message
    instead (flows/errors.py). They still reach the Prefect API's run logs; ``--debug`` shows them here too."""

    def filter(self, record: logging.LogRecord) -> bool:
        from flows.errors import debug_enabled

        return debug_enabled() or not (record.name.startswith("prefect") and record.levelno >= logging.ERROR)


def _no_prefect_tracebacks_on_console() -> None:
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger))]
    for handler in {h for lg in loggers for h in lg.handlers if isinstance(h, PrefectConsoleHandler)}:
        if not any(isinstance(f, _DropPrefectErrors) for f in handler.filters):
            handler.addFilter(_DropPrefectErrors())


def run_train(cfg: TrainConfig, console: Console, api: OwnSessionAPI | None = None) -> dict:
    """The train flow under a progress bar, on ``api`` (started by the caller, flows/interrupt.py) or the configured
    PREFECT_API_URL. SIGINT/SIGTERM: the flow stops at its next stage boundary and records it (flows/interrupt.py);
    this says what the MLflow run now is and how to resume, and exits 128 + the signal."""
    from flows.interrupt import deferred_signals, own_session_api, signal_name
    from flows.train import train

    if api is not None:  # the first stage's import (seconds) while the API comes up in its own process
        from transformers import AutoTokenizer  # noqa: F401

    with deferred_signals(), own_session_api(api):
        try:
            return _run_with_bar(cfg, console, train)
        except BaseException as e:
            sig = signal_name(e)
            if sig is None:
                raise
            _report_interrupt(console, cfg, sig)
    _exit_now(128 + int(getattr(signal, sig)))


def _exit_now(code: int, join_threads: bool = False) -> NoReturn:
    """Exit with ``code`` once the exit handlers have run (Prefect's log and event workers drain, its ephemeral API
    stops, MLflow's asynchronous queue flushes): the interpreter's own teardown of torch and the engines that follows
    took 15 s on a busy machine (2-3 s on a quiet one), with everything already recorded. ``join_threads``: first wait
    for the threads a normal exit waits for (non-daemon ones); an interrupt does not."""
    import atexit
    import os
    import sys
    import threading

    sys.stdout.flush()
    sys.stderr.flush()
    if join_threads:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
    if "prefect.events.worker" in sys.modules:  # first: the API they send to stops in an exit handler
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker

        for worker in (APILogWorker, EventsWorker):
            worker.drain_all(timeout=5)
    atexit._run_exitfuncs()  # noqa: SLF001  (CPython's: what a normal exit runs first)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _report_interrupt(console: Console, cfg: TrainConfig, sig: str) -> None:
    from flows.errors import mlflow_state

    state = mlflow_state(cfg.run_dir) or "no MLflow run was opened"
    console.print(f"interrupted ({sig}): {state}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"run dir: {cfg.run_dir}; rerun the same command to resume from its last checkpoint", markup=False,
                  highlight=False, soft_wrap=True)


def _run_with_bar(cfg: TrainConfig, console: Console, train) -> dict:
    _quiet_libraries()
    bar = Progress(TextColumn("[bold]rollout"), BarColumn(), MofNCompleteColumn(), TextColumn("reward {task.fields[reward]}"),
                   TimeElapsedColumn(), console=console)
    task_id = bar.add_task("train", total=None, reward="-")

    def on_rollout(i: int, n: int, metrics: dict) -> None:
        bar.update(task_id, total=n, completed=i + 1, reward=f"{metrics.get('rollout/raw_reward', float('nan')):.3f}")

    unsubscribe = progress.subscribe(on_rollout)
    try:
        with bar:
            summary = train(cfg)
    finally:
        unsubscribe()
    _print_summary(console, summary)
    return summary


def _print_summary(console: Console, s: dict) -> None:
    console.print(f"[bold green]done[/bold green]: {s['rollouts']} rollouts (resumed from {s['resumed_from']})")
    console.print(f"MLflow run id : {s['mlflow_run_id']}")
    console.print(f"MLflow store  : {s['tracking_uri']}  (mlflow ui --backend-store-uri {s['tracking_uri']})")
    if s["first_reward"] is not None:
        console.print(f"mean reward   : first {s['first_reward']:.3f} -> last {s['last_reward']:.3f}  "
                      f"(first 3: {s['first3_reward']:.3f}, last 3: {s['last3_reward']:.3f})")

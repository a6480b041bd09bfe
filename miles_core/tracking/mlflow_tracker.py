"""MLflow tracker: one run per training run, re-attached by id on resume.

Uses MlflowClient (no global active run), batched metric writes, and step axes:
rollout metrics at rollout/step, train metrics at train/step, eval metrics at eval/step.

``asynchronous=True`` (the train flow): metric batches go through MLflow's async logging queue (a
background thread writes them, merging queued batches), so a rollout does not wait for the store's
commit. ``flush()`` waits for them and raises the first error; ``end()`` and every read of the run by
this tracker flush first. The train flow flushes before each checkpoint, so a checkpoint never
precedes its metrics (a resumed run does not re-log steps at or before its checkpoint).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from .catalog import check_keys
from .keys import flatten, sanitize_key

MAX_PARAM_LEN = 6000


class MlflowTracker:
    def __init__(self, tracking_uri: str, experiment: str, run_name: str | None = None, run_id: str | None = None,
                 artifact_location: str | None = None, asynchronous: bool = False, empty_stores: Path | None = None):
        from mlflow.tracking import MlflowClient

        self.tracking_uri = tracking_uri
        self.asynchronous = asynchronous
        self._pending: list = []  # RunOperations of asynchronous metric batches not yet flushed
        with store_turn(tracking_uri):  # the store's tables and the experiment are made once, by one process
            if empty_stores is not None:
                seed_store(tracking_uri, empty_stores)
            self.client = MlflowClient(tracking_uri=tracking_uri)
            if run_id is None:
                exp = self.client.get_experiment_by_name(experiment)
                exp_id = exp.experiment_id if exp else self.client.create_experiment(experiment, artifact_location=artifact_location)
        if run_id is None:
            run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id
        self.run_id = run_id

    @property
    def experiment_id(self) -> str:
        return self.client.get_run(self.run_id).info.experiment_id

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        flat = flatten(params)
        items = [Param(sanitize_key(k), param_str(v)) for k, v in sorted(flat.items())]
        existing = self.client.get_run(self.run_id).data.params
        new = [p for p in items if p.key not in existing]
        for i in range(0, len(new), 100):
            self.client.log_batch(self.run_id, params=new[i : i + 100])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        check_keys(metrics)  # every key must be in the metrics catalog (catalog.py; MILES_METRICS_CHECK)
        now = int(time.time() * 1000)
        items = [Metric(sanitize_key(k), float(v), now, int(step)) for k, v in metrics.items()]
        for i in range(0, len(items), 1000):
            op = self.client.log_batch(self.run_id, metrics=items[i : i + 1000], synchronous=not self.asynchronous)
            if op is not None:
                self._pending.append(op)
        if len(self._pending) >= 1000:  # a long run without saves: bound the list (these are long done)
            self.flush()

    def flush(self) -> None:
        """Wait for the asynchronous metric batches logged so far (no-op when synchronous); raises the first error."""
        pending, self._pending = self._pending, []
        for op in pending:
            op.wait()

    def log_table(self, rows: list[dict[str, Any]], artifact_file: str) -> None:
        if rows:
            cols = {k: [r.get(k) for r in rows] for k in rows[0]}
            self.client.log_table(self.run_id, data=cols, artifact_file=artifact_file)

    def log_dict(self, data: dict, artifact_file: str) -> None:
        self.client.log_dict(self.run_id, data, artifact_file)

    def set_tags(self, tags: dict[str, str]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, v)

    def end(self, status: str = "FINISHED") -> None:
        self.flush()
        self.client.set_terminated(self.run_id, status=status)

    def metric_history(self, key: str) -> list[tuple[int, float]]:
        self.flush()
        return [(m.step, m.value) for m in self.client.get_metric_history(self.run_id, key)]

    def log_artifacts(self, local_dir: str, artifact_path: str) -> None:
        self.client.log_artifacts(self.run_id, local_dir, artifact_path=artifact_path)

    def log_new_files(self, paths: list[Path], artifact_path: str) -> list[Path]:
        """Log the files of ``paths`` the run has no artifact of that name for under ``artifact_path``; -> those logged."""
        have = {Path(a.path).name for a in self.client.list_artifacts(self.run_id, artifact_path)}
        new = [p for p in paths if p.name not in have]
        for p in new:
            self.client.log_artifact(self.run_id, str(p), artifact_path=artifact_path)
        return new


def histories(client, run_id: str, keys: list[str]) -> dict[str, list[tuple[int, float]]]:
    """key -> (step, value) sorted by step (the last value logged at a step wins), for the keys the run has."""
    out = {}
    for key in keys:
        points = {m.step: m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))}
        if points:
            out[key] = sorted(points.items())
    return out


def param_str(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v)
    return s[:MAX_PARAM_LEN]


def mlflow_client(tracking_uri: str):
    """An MlflowClient for ``tracking_uri`` (the one place outside the tracker that builds one)."""
    from mlflow.tracking import MlflowClient

    with store_turn(tracking_uri):
        return MlflowClient(tracking_uri)


@contextmanager
def store_turn(tracking_uri: str):
    """Processes opening one SQLite store take turns while the first client of each creates or upgrades its
    tables: two flow runs of a deployment share its ``mlflow.db``, and MLflow's migrations run by two processes
    at once fail the second ("duplicate column name: step"). An exclusive ``flock`` on ``<db>.lock`` beside the
    store; other stores (a server) and a store in a directory we cannot write need no turn."""
    db = sqlite_path(tracking_uri)
    try:
        fd = os.open(f"{db}.lock", os.O_RDWR | os.O_CREAT, 0o644) if db else None
    except OSError:
        fd = None
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the flock


def seed_store(tracking_uri: str, empty_stores: Path) -> None:
    """A new SQLite store starts as a copy of an empty one made once per MLflow version (in ``empty_stores``):
    MLflow's 68 migrations take 2-3 s for every new store otherwise. The copy holds the tables at MLflow's head
    revision and no experiment: MLflow adds its Default experiment on open, with this store's artifact root.
    Call under ``store_turn``."""
    db = sqlite_path(tracking_uri)
    if db is None or db.exists() or not db.parent.is_dir():
        return
    template = _empty_store(empty_stores)
    if template is None:
        return
    tmp = db.with_name(f".{db.name}.{os.getpid()}.tmp")
    try:
        shutil.copyfile(template, tmp)
        os.replace(tmp, db)
    except OSError:
        tmp.unlink(missing_ok=True)  # MLflow creates the store itself then


def _empty_store(empty_stores: Path) -> Path | None:
    import sqlite3

    import mlflow

    path = empty_stores / f"empty-store-{mlflow.__version__}.db"
    if path.exists():
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        store = SqlAlchemyStore(f"sqlite:///{tmp}", str(path.parent / "artifacts"))  # nothing is written there
        store.engine.dispose()
        with closing(sqlite3.connect(tmp)) as con, con:
            con.execute("DELETE FROM experiments")  # the Default one, with this template's artifact root
        os.replace(tmp, path)  # atomic: a process racing this one makes its own and replaces it with an equal one
    except (OSError, sqlite3.Error):
        return None  # MLflow migrates the new store itself
    return path


def sqlite_path(tracking_uri: str) -> Path | None:
    """The file of a ``sqlite:///path`` store, else None."""
    return Path(tracking_uri.removeprefix("sqlite:///")) if tracking_uri.startswith("sqlite:///") else None


def active_run(client, run_id: str | None):
    """The run ``run_id`` if it exists and is not deleted, else None."""
    from mlflow.exceptions import MlflowException

    if not run_id:
        return None
    try:
        run = client.get_run(run_id)
    except MlflowException:
        return None
    return run if run.info.lifecycle_stage == "active" else None

"""A new SQLite store is seeded from an empty one made once per MLflow version (tracking/mlflow_tracker.seed_store):
the same tables, indexes and revision as a store MLflow migrates itself, and a Default experiment of its own."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import mlflow
from mlflow.tracking import MlflowClient

from miles_core.tracking import MlflowTracker


def _schema(db) -> tuple[list, list]:
    """Every table's columns (name, type, not-null, default, key) and every index's columns, and the revision. Not the
    CREATE text: MLflow's own migrations write a CHECK's values in an order that varies between processes."""
    with closing(sqlite3.connect(db)) as con:
        shape = []
        for kind, name in sorted(con.execute("SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")):
            info = "table_info" if kind == "table" else "index_info"
            shape.append((kind, name, [row[1:] for row in con.execute(f'PRAGMA {info}("{name}")')]))
        return shape, con.execute("SELECT version_num FROM alembic_version").fetchall()


def test_a_seeded_store_is_the_store_mlflow_makes(tmp_path):
    own = tmp_path / "own" / "mlflow.db"
    own.parent.mkdir()
    MlflowClient(f"sqlite:///{own}").search_experiments()  # MLflow's own migrations

    seeded = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        db = tmp_path / name / "mlflow.db"
        tracker = MlflowTracker(f"sqlite:///{db}", "miles", artifact_location=str(tmp_path / name / "mlruns"),
                               empty_stores=tmp_path / "cache" / "mlflow")
        tracker.log_metrics({"rollout/raw_reward": 0.5}, step=0)
        tracker.end()
        seeded.append(db)
    (template,) = (tmp_path / "cache" / "mlflow").iterdir()
    assert template.name == f"empty-store-{mlflow.__version__}.db"

    want = _schema(own)
    for db in seeded:
        got = _schema(db)
        assert got == want, (set(got[0]) ^ set(want[0]), got[1], want[1])
    for name, db in zip("ab", seeded):
        client = MlflowClient(f"sqlite:///{db}")
        default = client.get_experiment("0")  # added on open, with this store's artifact root, not the template's
        assert default.name == "Default" and str(tmp_path / "cache") not in default.artifact_location
        (run,) = client.search_runs([client.get_experiment_by_name("miles").experiment_id])
        assert run.data.metrics == {"rollout/raw_reward": 0.5}
    with closing(sqlite3.connect(template)) as con:
        assert con.execute("SELECT count(*) FROM experiments").fetchone() == (0,)  # nothing of a run went into it

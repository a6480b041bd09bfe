"""Weights & Biases mirror: each key plotted against its own step axis (``define_metric`` with
``step_metric``), the flattened config as the W&B config.

The W&B run id is recorded in ``<run_dir>/wandb_run.json`` with the MLflow run it mirrors and the
highest step sent per axis (written after every row sent): a resume of the same MLflow run
resumes the same W&B run and starts above those marks. A new MLflow run (``mlflow_new_run``) gets a
new W&B run; ``wandb_run_id`` names the W&B run explicitly.

Naming, as the reference's init_wandb_primary (miles/utils/tracking_utils/wandb_utils.py) when ``wandb_group`` is
given: the group is ``<wandb_group>_<8 random characters>`` (W&B's generate_id, kept in the record so a resume
stays in it) and the run ``<group>-RANK_0`` (one process logs); with ``disable_wandb_random_suffix`` the group and
the run are ``wandb_group`` itself. Without ``wandb_group`` (the reference requires it) no group, and the run is
named after the MLflow run.

wandb_always_use_train_step: the values W&B gets for rollout/step and eval/step are train steps, as the reference's
metric_utils.compute_rollout_step (rollout_id * num_steps_per_rollout): rollout i at i * S; an eval point, whose
eval/step is the weight version it evaluated (docs/decisions.md: i + 2 after rollout i, 1 before training), at
max(version - 2, 0) * S, the step of the rollout it follows (the reference's eval(rollout_id); 0 before training).
The record and the resume marks keep miles' own steps.

Never reaches the network unless ``wandb_mode`` (or WANDB_MODE) is online: W&B's error reporting and
homes are set in miles_core/env.py.
"""

from __future__ import annotations

import importlib
import json
import os
import secrets
import sys
import tempfile
from pathlib import Path

from .catalog import AXES, ROLLOUT, TRAIN
from .keys import flatten, sanitize_key

RECORD = "wandb_run.json"


def _wandb():
    """The wandb package. Its import makes two temporary directories (wandb/sdk/data_types/_private.py's MEDIA_TMP,
    wandb/sdk/artifacts/artifact.py's _TMP_DIR) that only an orderly interpreter exit removes: a run stopped by
    SIGKILL left them in /tmp. They are made beside W&B's cache (WANDB_CACHE_DIR, which miles_core/env.py puts under
    the project's cache) instead."""
    home = os.environ.get("WANDB_CACHE_DIR")
    if "wandb" not in sys.modules and home:
        tmp = Path(home).parent / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        saved, tempfile.tempdir = tempfile.tempdir, str(tmp)
        try:
            importlib.import_module("wandb")
        finally:
            tempfile.tempdir = saved
    return importlib.import_module("wandb")


def _server(host: str | None) -> dict[str, str]:
    """W&B settings naming the server (the reference's --wandb-host); none: W&B's own (WANDB_BASE_URL, its login)."""
    return {"base_url": host.rstrip("/")} if host else {}


def _naming(t, recorded_group: str | None, run_name: str) -> tuple[str | None, str]:
    """(W&B group, run name) (module docstring); ``recorded_group``: the group this W&B run was opened in."""
    if t.wandb_group is None:
        return None, run_name
    if t.disable_wandb_random_suffix:
        return t.wandb_group, t.wandb_group
    _wandb()
    from wandb.sdk.lib.runid import generate_id

    group = recorded_group or f"{t.wandb_group}_{generate_id()}"
    return group, f"{group}-RANK_0"


class WandbMirror:
    name = "wandb"

    def __init__(self, run, record: Path, mlflow_run_id: str, marks: dict[str, int], group: str | None = None,
                 train_steps: int | None = None):
        self.run, self.group = run, group
        self.train_steps = train_steps  # wandb_always_use_train_step: num_steps_per_rollout; None: miles' own steps
        self.record = record
        self.mlflow_run_id = mlflow_run_id
        self.marks = dict(marks)  # at open (resume); fixed
        self._logged = dict(marks)  # the highest step logged per axis, written to the record
        self._defined: set[str] = set()
        self._pending: tuple[str, int, dict] | None = None  # (axis, step, row) not sent yet
        self._write_record()

    @classmethod
    def open(cls, spec) -> "WandbMirror":
        wandb = _wandb()
        t = spec.tracking
        record = spec.run_dir / RECORD
        previous = json.loads(record.read_text()) if record.exists() else {}
        same_run = previous.get("mlflow_run_id") == spec.mlflow_run_id and (not t.wandb_run_id or t.wandb_run_id == previous.get("run_id"))
        run_id = t.wandb_run_id or (previous["run_id"] if same_run else secrets.token_hex(4))
        group, name = _naming(t, previous.get("group") if same_run else None, spec.run_name)
        wandb_dir = Path(t.wandb_dir).absolute() if t.wandb_dir else spec.run_dir
        for d in (wandb_dir, spec.run_dir):
            d.mkdir(parents=True, exist_ok=True)
        run = wandb.init(project=t.wandb_project or t.mlflow_experiment_name, entity=t.wandb_team, group=group,
                         name=name, id=run_id, resume="allow", dir=str(wandb_dir), mode=t.wandb_mode,
                         config=flatten(spec.params), settings=wandb.Settings(console="off", **_server(t.wandb_host)))
        for axis in AXES:
            run.define_metric(axis)
        return cls(run, record, spec.mlflow_run_id, previous.get("marks", {}) if same_run else {}, group,
                   spec.steps_per_rollout if t.wandb_always_use_train_step else None)

    @property
    def link(self) -> str:
        """The run's W&B page (online), else its local directory (offline: ``wandb sync <dir>``)."""
        return self.run.url or str(Path(self.run.dir).parent)

    def log(self, metrics: dict[str, float], axis: str, step: int) -> None:
        """A new row; the previous one is sent (a row waits for the timings ``log_extra`` adds at its step)."""
        self.flush()
        self._pending = (axis, step, self._row(metrics, axis) | self._axis_value(axis, step))

    def log_extra(self, metrics: dict[str, float], axis: str, step: int) -> None:
        """Metrics at a step already logged: into that step's row while it waits, else a row of its own."""
        if self._pending and self._pending[:2] == (axis, step):
            self._pending[2].update(self._row(metrics, axis))
        else:
            self.flush()
            self._pending = (axis, step, {**self._row(metrics, axis), axis: step} | self._axis_value(axis, step))

    def _axis_value(self, axis: str, step: int) -> dict[str, float]:
        """wandb_always_use_train_step: the train step W&B plots a rollout or eval row at (module docstring)."""
        if self.train_steps is None or axis == TRAIN:
            return {}
        rollout_id = step if axis == ROLLOUT else max(step - 2, 0)  # eval/step: the version after rollout i is i + 2
        return {axis: float(rollout_id * self.train_steps)}

    def _row(self, metrics: dict[str, float], axis: str) -> dict[str, float]:
        """The row with MLflow's keys; a key seen for the first time is plotted against ``axis``."""
        row = {sanitize_key(k): float(v) for k, v in metrics.items()}
        for key in row.keys() - self._defined - set(AXES):
            self.run.define_metric(key, step_metric=axis)
        self._defined |= row.keys()
        return row

    def flush(self) -> None:
        """Send the waiting row (W&B's service process owns it once ``run.log`` returns) and record its step."""
        if self._pending:
            axis, step, row = self._pending
            self._pending = None
            self.run.log(row)
            self._logged[axis] = max(step, self._logged.get(axis, -1))
            self._write_record()

    def close(self, status: str) -> None:
        """Finish the run and stop W&B's service process: only then are its files complete on disk (``finish``
        returns before the transaction log is written out), so ``wandb sync`` or ``read_history`` right after see it all."""
        wandb = _wandb()
        self.flush()
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)
        wandb.teardown()

    def _write_record(self) -> None:
        tmp = self.record.with_suffix(".tmp")
        tmp.write_text(json.dumps({"run_id": self.run.id, "mlflow_run_id": self.mlflow_run_id, "marks": self._logged,
                                   "group": self.group}))
        os.replace(tmp, self.record)


def read_history(wandb_dir: Path, run_id: str) -> list[dict]:
    """The history rows of W&B run ``run_id`` under ``<wandb_dir>/wandb/``, from W&B's own transaction
    logs (``run-<id>.wandb``, written online and offline; one per process that logged), in order."""
    rows: list[dict] = []
    for path in sorted(Path(wandb_dir, "wandb").glob(f"*-{run_id}/run-{run_id}.wandb")):
        for record in _records(path):
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item})
    return rows


def _records(path: Path):
    """W&B's framing (LevelDB log): a 7-byte file header (":W&B", magic, version), then 32 KiB blocks of
    chunks (u32 crc, u16 length, u8 type: 1 full, 2 first, 3 middle, 4 last); a block's tail under 7
    bytes is padding. Each whole chunk sequence is one serialized Record."""
    import struct

    _wandb()
    from wandb.proto.wandb_internal_pb2 import Record

    data, block = path.read_bytes(), 32768
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B transaction log")
    pos, parts = 7, []
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding: the writer stopped here
            break
        parts.append(data[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):
            yield Record.FromString(b"".join(parts))
            parts = []

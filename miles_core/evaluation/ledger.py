"""The MLflow side of the eval flow: the run it logs into, what that run already has, and the
training config recovered from the run's params.

- The training run (its id from the checkpoint meta or the run dir), when it still exists; otherwise
  a *linked* run in the same store, tagged ``miles.eval_of=<training run id>``, found again by that tag
  on the next eval, so a rerun never opens a second one.
- Idempotent: a point whose step is in the run's ``eval/step`` history is done; a skip is logged once
  per (reason, step). A skipped point is retried by the next eval (its step is not in eval/step).
- Params are the flattened resolved config (``group.field`` -> JSON text, strings raw): parsed back
  into flat config values, so the eval uses the run's own datasets, sampling and reward settings.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

from miles_core.config import GROUPS
from miles_core.tracking import MlflowTracker
from miles_core.tracking.mlflow_tracker import active_run, mlflow_client

from .discover import RunRef
from .point import PointResult
from .skip import skipped_reason

LINK_TAG = "miles.eval_of"


class EvalLedger:
    def __init__(self, ref: RunRef, experiment: str = "miles", link_key: str | None = None):
        self.client = mlflow_client(ref.tracking_uri)
        self.source_run_id = ref.run_id
        run = self._live_run(ref.run_id)
        self.linked = run is None
        self.training_params: dict[str, str] = run.data.params if run else {}
        if run is not None:
            self.tracker = MlflowTracker(ref.tracking_uri, experiment, run_id=run.info.run_id)
        else:
            self.tracker = self._linked_run(ref, experiment, link_key or ref.run_id or "unknown")

    @property
    def run_id(self) -> str:
        return self.tracker.run_id

    def _live_run(self, run_id: str | None):
        return active_run(self.client, run_id)

    def _linked_run(self, ref: RunRef, experiment: str, key: str) -> MlflowTracker:
        exp = self.client.get_experiment_by_name(experiment)
        if exp is not None and exp.lifecycle_stage == "active":
            found = self.client.search_runs([exp.experiment_id], filter_string=f"tags.`{LINK_TAG}` = '{key}'", max_results=1)
            if found:
                return MlflowTracker(ref.tracking_uri, experiment, run_id=found[0].info.run_id)
        name = experiment if exp is None or exp.lifecycle_stage == "active" else f"{experiment}-eval"
        artifacts = (ref.run_dir / "mlruns").as_uri() if ref.run_dir and ref.tracking_uri.startswith("sqlite:") else None
        tracker = MlflowTracker(ref.tracking_uri, name, run_name=f"eval-of-{key[:12]}", artifact_location=artifacts)
        tracker.set_tags({LINK_TAG: key, "miles.eval_note": f"training run {key} is gone; eval metrics of its checkpoints land here"})
        return tracker

    def done_steps(self) -> set[int]:
        return {int(m.value) for m in self.client.get_metric_history(self.run_id, "eval/step")}

    def _logged(self, key: str, step: int) -> bool:
        return any(m.step == step for m in self.client.get_metric_history(self.run_id, key))

    def record(self, result: PointResult, lag_steps: int | None = None) -> bool:
        """Log a point's outcome once; -> False when it was already there."""
        reason = skipped_reason(result.metrics)
        if reason is not None:
            if self._logged(f"eval/skipped_{reason}", result.step):
                return False
            self.tracker.log_metrics(result.metrics, step=result.step)
            return True
        if result.step in self.done_steps():
            return False
        lag = {"eval/lag_steps": float(lag_steps)} if lag_steps is not None else {}
        self.tracker.log_metrics({**result.metrics, **lag, "eval/step": result.step}, step=result.step)
        self.tracker.log_table(result.rows, f"eval/samples_step_{result.step}.json")
        return True


def config_values_from_params(params: dict[str, str]) -> dict[str, Any]:
    """MLflow params of a training run -> flat config values (``derived.*`` and unknown keys dropped).
    A non-empty dict field was flattened into one param per entry (``sglang.sglang_server_args.ep_size``):
    its entries are gathered back into the dict."""
    fields = {(g, n): f for g, model in GROUPS.items() for n, f in model.model_fields.items()}
    out: dict[str, Any] = {}
    for key, raw in params.items():
        group, _, rest = key.partition(".")
        name, _, entry = rest.partition(".")
        if (group, name) not in fields:
            continue
        if entry:
            _set_entry(out.setdefault(name, {}), entry.split("."), _entry_value(name, entry, raw))
            continue
        value = _json_or_text(raw)
        if value is not None and not isinstance(value, str) and _is_text(fields[(group, name)].annotation):
            value = raw  # a string field whose text happens to parse as JSON ("1234")
        out[name] = value
    return out


def _json_or_text(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _entry_value(field: str, entry: str, raw: str) -> Any:
    """One entry of a dict field. SGLang server arguments know their types (text stays text for a str
    argument, as for a str field); other entries are JSON, else text."""
    if field == "sglang_server_args":
        from miles_core.config.server_args import snapshot

        arg = snapshot().args.get(entry)
        if arg is not None and arg.type == "str":
            return raw
    return _json_or_text(raw)


def _set_entry(d: dict, path: list[str], value: Any) -> None:
    for part in path[:-1]:
        d = d.setdefault(part, {})
    d[path[-1]] = value


def _is_text(annotation) -> bool:
    """str, a Literal of strings, or a union of those with None."""
    origin = typing.get_origin(annotation)
    if annotation is str:
        return True
    if origin is typing.Literal:
        return all(isinstance(a, str) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return all(_is_text(a) for a in typing.get_args(annotation) if a is not type(None))
    return False

"""What a person wants to know about a run, read from its MLflow run: the curves, the eval table,
the best eval per dataset, the exports and the champion. Shared by the Prefect summary artifact of
the train flow and ``miles report <run-dir>`` (``write_report``: the plots plus a one-page HTML
summary, for a finished or a running run).
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass
from pathlib import Path

from . import plots
from .mlflow_tracker import histories, mlflow_client
from .registry import CHAMPION

RUN_MARKER = "mlflow_run.json"  # <run_dir>/mlflow_run.json: {run_id, tracking_uri}, written when the train flow opens its run
KEY_PARAMS = ("checkpoint.hf_checkpoint", "data.prompt_data", "algo.advantage_estimator", "rollout.num_rollout",
              "rollout.rollout_batch_size", "rollout.n_samples_per_prompt", "algo.lr", "cluster.runtime")


@dataclass(frozen=True)
class Export:
    rollout_id: int
    detail: str  # "rollout_id=.. train_step=.." (the run's miles.export.<id> tag)
    artifact_uri: str


@dataclass(frozen=True)
class RunFacts:
    """One MLflow run, read once. ``histories``: the plotted keys and every eval/<ds> key."""

    run_id: str
    run_name: str
    status: str
    tracking_uri: str
    experiment_id: str
    params: dict[str, str]
    tags: dict[str, str]
    histories: plots.History
    exports: tuple[Export, ...]
    champion: str | None  # "<model> v<version> (rollout <id>)", when the run registers its exports

    @property
    def datasets(self) -> list[str]:
        return plots.datasets(self.histories)

    def eval_table(self) -> list[dict[str, float]]:
        """One row per eval step: {"eval/step": s, <ds>: reward, ...}."""
        rows: dict[int, dict[str, float]] = {}
        for ds in self.datasets:
            for step, value in self.histories.get(f"eval/{ds}", []):
                rows.setdefault(step, {"eval/step": step})[ds] = value
        return [rows[s] for s in sorted(rows)]

    def best_evals(self) -> dict[str, tuple[int, float]]:
        """dataset -> (eval/step, reward) of its best point (the earliest among equals)."""
        out = {}
        for ds in self.datasets:
            points = self.histories.get(f"eval/{ds}", [])
            if points:
                out[ds] = max(points, key=lambda p: (p[1], -p[0]))
        return out


def read_run(tracking_uri: str, run_id: str) -> RunFacts:
    client = mlflow_client(tracking_uri)
    run = client.get_run(run_id)
    keys = plots.wanted_keys(run.data.metrics) + [f"eval/{ds}" for ds in plots.datasets(run.data.metrics)]
    exports = tuple(
        Export(int(tag.rsplit(".", 1)[1]), value, f"{run.info.artifact_uri}/export/{tag.rsplit('.', 1)[1]}")
        for tag, value in sorted(run.data.tags.items()) if tag.startswith("miles.export.")
    )
    return RunFacts(run_id=run_id, run_name=run.info.run_name, status=run.info.status, tracking_uri=tracking_uri,
                    experiment_id=run.info.experiment_id, params=dict(run.data.params), tags=dict(run.data.tags),
                    histories=histories(client, run_id, sorted(set(keys))), exports=exports,
                    champion=_champion(client, run.data.params.get("checkpoint.registered_model_name")))


def _champion(client, model_name: str | None) -> str | None:
    from mlflow.exceptions import MlflowException

    if not model_name or model_name == "null":
        return None
    try:
        mv = client.get_model_version_by_alias(model_name, CHAMPION)
    except MlflowException:
        return None
    return f"{model_name} v{mv.version} (rollout {mv.tags.get('rollout_id', '?')})"


def run_of(run_dir: Path) -> tuple[str, str]:
    """(tracking_uri, run_id) of the train flow's run in ``run_dir``."""
    marker = run_dir / RUN_MARKER
    if not marker.exists():
        raise FileNotFoundError(f"{marker} not found: {run_dir} is not the run dir of a train run (or the run never opened MLflow)")
    data = json.loads(marker.read_text())
    return data["tracking_uri"], data["run_id"]


def data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()


def write_report(run_dir: Path, out_dir: Path | None = None) -> Path:
    """<out_dir>/index.html (default <run_dir>/report/) with the plots beside it -> the HTML path."""
    out = out_dir or run_dir / "report"
    facts = read_run(*run_of(run_dir))
    pngs = plots.render(facts.histories, out)
    page = out / "index.html"
    page.write_text(_html(facts, pngs))
    return page


def _html(f: RunFacts, pngs: list[Path]) -> str:
    e = html.escape
    config = "".join(f"<tr><td>{e(k)}</td><td>{e(f.params[k])}</td></tr>" for k in KEY_PARAMS if k in f.params)
    ds = f.datasets
    evals = "".join("<tr>" + "".join(f"<td>{_num(row.get(c))}</td>" for c in ["eval/step", *ds]) + "</tr>" for row in f.eval_table())
    exports = "".join(f"<li>{e(x.detail)}: <code>{e(x.artifact_uri)}</code></li>" for x in f.exports) or "<li>none</li>"
    best = "".join(f"<li>{e(d)}: {v:.4g} at eval/step {s}</li>" for d, (s, v) in f.best_evals().items()) or "<li>no eval yet</li>"
    images = "".join(f'<figure><img src="{e(p.name)}" alt="{e(p.stem)}"><figcaption>{e(p.stem)}</figcaption></figure>' for p in pngs)
    links = "".join(f"<li>{e(k)}: {e(v)}</li>" for k, v in sorted(f.tags.items()) if k.startswith(("prefect.", "miles.wandb",
                                                                                                   "miles.tensorboard", "miles.prometheus")))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>miles report: {e(f.run_name)}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px}} img{{max-width:100%}} figure{{margin:1em 0}}</style></head><body>
<h1>miles report: {e(f.run_name)}</h1>
<p>MLflow run <code>{e(f.run_id)}</code> ({e(f.status)}) in <code>{e(f.tracking_uri)}</code>, experiment {e(f.experiment_id)}</p>
<ul>{links}</ul>
<h2>Config</h2><table>{config}</table>
<h2>Curves</h2>{images or "<p>no metrics logged yet</p>"}
<h2>Eval</h2><p>Best per dataset:</p><ul>{best}</ul>
<table><tr>{"".join(f"<th>{e(c)}</th>" for c in ["eval/step", *ds])}</tr>{evals}</table>
<h2>Exports</h2><ul>{exports}</ul>
<h2>Champion</h2><p>{e(f.champion or "none")}</p>
</body></html>
"""


def _num(v) -> str:
    return "" if v is None else f"{v:.4g}"

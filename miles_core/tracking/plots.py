"""The run's curves as PNG files (matplotlib, no pyplot state): reward (raw, and per eval dataset),
response length, truncation, KL / clip fraction / grad norm, log-prob mismatch and staleness.

``render(histories, out_dir)`` draws every plot that has data. Each PNG carries the series it was
drawn from as a ``miles.series`` text chunk (JSON ``{key: [[step, value], ...]}``), so a reader (a
test, a notebook) gets the numbers behind a curve without the tracking store. The train flow logs
them to MLflow under ``plots/`` at each eval point and at the end (``RunTracker.log_plots``);
``miles report`` draws the same files for a finished or running run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

History = dict[str, list[tuple[int, float]]]  # MLflow key -> (step, value) sorted by step
SERIES_CHUNK = "miles.series"
DS = "<ds>"  # expanded over the run's eval datasets (the keys eval/<ds>/truncated_ratio it has)


@dataclass(frozen=True)
class Panel:
    title: str
    keys: tuple[str, ...]  # MLflow keys; <ds> stands for each eval dataset
    xlabel: str  # the step axis of those keys


@dataclass(frozen=True)
class Plot:
    name: str  # the file: <name>.png
    title: str
    panels: tuple[Panel, ...]


_R, _T, _E = "rollout/step", "train/step", "eval/step"
PLOTS: tuple[Plot, ...] = (
    Plot("reward", "Reward", (Panel("rollout reward (raw, before post-processing)", ("rollout/raw_reward",), _R),
                              Panel("eval reward per dataset", (f"eval/{DS}",), _E))),
    Plot("response_length", "Response length (tokens)",
         (Panel("rollout", ("rollout/response_len/mean", "rollout/response_len/max", "rollout/response_len/min"), _R),
          Panel("eval (mean)", (f"eval/{DS}/response_len/mean",), _E))),
    Plot("truncation", "Truncated responses (hit the length limit)",
         (Panel("rollout", ("rollout/truncated_ratio",), _R), Panel("eval", (f"eval/{DS}/truncated_ratio",), _E))),
    Plot("optimization", "Optimization",
         (Panel("KL", ("train/ppo_kl", "train/kl_loss"), _T), Panel("clip fraction", ("train/pg_clipfrac",), _T),
          Panel("grad norm", ("train/grad_norm",), _T))),
    Plot("mismatch", "Rollout / train mismatch and staleness",
         (Panel("log-prob mismatch", ("train/train_rollout_logprob_abs_diff", "train/train_rollout_kl"), _T),
          Panel("staleness (weight syncs)", ("rollout/staleness/mean", "rollout/staleness/max"), _R))),
)
_TRUNCATED = f"eval/{DS}/truncated_ratio"  # logged for every eval dataset
_DATASET = re.compile(re.escape(_TRUNCATED).replace(re.escape(DS), "(.+)") + r"\Z")


def datasets(keys) -> list[str]:
    """The eval datasets a run has (from its eval/<ds>/truncated_ratio keys)."""
    return sorted(m.group(1) for k in keys if (m := _DATASET.match(k)))


def wanted_keys(keys) -> list[str]:
    """The keys of ``keys`` (a run's metric names) that some plot draws."""
    names = set(keys)
    return sorted({k for plot in PLOTS for panel in plot.panels for k in _expand(panel.keys, names)})


def _expand(keys: tuple[str, ...], present: set[str]) -> list[str]:
    ds = datasets(present)
    out = []
    for key in keys:
        out += [key.replace(DS, d) for d in ds] if DS in key else [key]
    return [k for k in out if k in present]


def render(histories: History, out_dir: Path) -> list[Path]:
    """Draw every plot with data into ``out_dir`` (-> the PNG paths written)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for plot in PLOTS:
        panels = [(panel, _expand(panel.keys, set(histories))) for panel in plot.panels]
        if any(keys for _, keys in panels):
            written.append(_draw(plot, panels, histories, out_dir / f"{plot.name}.png"))
    return written


def _draw(plot: Plot, panels: list[tuple[Panel, list[str]]], histories: History, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(4.2 * len(panels), 3.2), dpi=90)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.16, top=0.82, wspace=0.3)
    FigureCanvasAgg(fig)
    fig.suptitle(plot.title)
    series = {}
    for ax, (panel, keys) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel(panel.xlabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.grid(alpha=0.3)
        for key in keys:
            points = histories[key]
            series[key] = [[s, v] for s, v in points]
            ax.plot([s for s, _ in points], [v for _, v in points], marker="o" if len(points) <= 30 else None, markersize=3,
                    linewidth=1.2, label=key)
        if keys:
            ax.legend(fontsize=6)
        else:
            ax.text(0.5, 0.5, "not logged by this run", ha="center", va="center", transform=ax.transAxes, fontsize=8, alpha=0.6)
    fig.savefig(path, format="png", metadata={SERIES_CHUNK: json.dumps(series)})
    return path


def read_series(path: Path) -> dict[str, list[list[float]]]:
    """The series a PNG of ``render`` was drawn from."""
    from PIL import Image

    with Image.open(path) as img:
        return json.loads(img.text[SERIES_CHUNK])

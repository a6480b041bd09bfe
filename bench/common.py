"""What every benchmark of the harness shares: the machine and version record, robust statistics,
and one writer for ``bench/results/<name>.json`` plus ``bench/results/<name>.md``.

A result file is one JSON object:
    bench, created_at (UTC), machine {platform, cpu, cpus, torch_threads, load_avg_start/end},
    versions {package: version}, config {...}, figures {...}, ratios {...}, noise {...}, notes [...]
and the markdown file is the human summary of the same numbers (tables first, then notes).
Figures are medians over interleaved repeats; ``noise`` states the spread (IQR / median).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TMP = ROOT / "bench" / ".tmp"

def results_dir() -> Path:
    """Where results are written: bench/results, or MILES_BENCH_RESULTS (a scratch dir for trial runs and tests)."""
    return Path(os.environ.get("MILES_BENCH_RESULTS") or RESULTS)


BASE_PACKAGES = ("torch", "transformers", "miles", "prefect", "mlflow")


def package_versions(*extra: str) -> dict[str, str]:
    out = {}
    for name in (*BASE_PACKAGES, *extra):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    import torch

    return {
        "platform": platform.platform(), "python": platform.python_version(), "cpu": cpu_model(),
        "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "load_avg_start": list(os.getloadavg()),
    }


def summarize(xs: list[float]) -> dict[str, float]:
    """median, quartiles, min, max, n and the relative spread (IQR / median)."""
    xs = sorted(float(x) for x in xs)
    if not xs:
        return {"n": 0}
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0], xs[0], xs[0]]
    med = statistics.median(xs)
    return {"median": med, "p25": q[0], "p75": q[2], "min": xs[0], "max": xs[-1], "n": len(xs),
            "rel_iqr": (q[2] - q[0]) / med if med else 0.0}


def paired_ratio(a: list[float], b: list[float]) -> dict[str, float]:
    """Median and quartiles of a[i] / b[i] over interleaved pairs (each pair ran back to back)."""
    return summarize([x / y for x, y in zip(a, b) if y > 0])


@dataclass
class Result:
    bench: str
    config: dict[str, Any]
    figures: dict[str, Any] = field(default_factory=dict)
    ratios: dict[str, Any] = field(default_factory=dict)
    noise: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)  # markdown tables for the summary
    extra_packages: tuple[str, ...] = ()
    machine: dict[str, Any] = field(default_factory=machine_info)

    def to_json(self) -> dict[str, Any]:
        from .monitor import active_summary

        machine = {**self.machine, "load_avg_end": list(os.getloadavg())}
        monitor = active_summary()
        if monitor is not None:  # CPU of other processes and steal while this benchmark ran (bench/monitor.py)
            machine["interference"] = monitor
        return {
            "bench": self.bench, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine,
            "versions": package_versions(*self.extra_packages), "config": self.config, "figures": self.figures,
            "ratios": self.ratios, "noise": self.noise, "notes": self.notes,
        }

    def markdown(self, data: dict[str, Any]) -> str:
        m = data["machine"]
        head = [
            f"# bench: {self.bench}", "",
            f"{data['created_at']} · {m['cpu']} · {m['cpus']} CPUs · torch threads {m['torch_threads']} · "
            f"load avg {m['load_avg_start'][0]:.1f} -> {m['load_avg_end'][0]:.1f}", "",
            "versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items()), "",
        ]
        if "interference" in m:
            from .monitor import describe

            head[4:4] = [f"while it ran: {describe(m['interference'])}", ""]
        body = [t + "\n" for t in self.tables]
        notes = [f"- {n}" for n in self.notes]
        return "\n".join(head + body + notes) + "\n"

    def write(self, out_dir: Path | None = None, name: str | None = None) -> Path:
        out_dir = out_dir or results_dir()
        out_dir.mkdir(parents=True, exist_ok=True)
        data = self.to_json()
        path = out_dir / f"{name or self.bench}.json"
        path.write_text(json.dumps(data, indent=2, default=float) + "\n")
        path.with_suffix(".md").write_text(self.markdown(data))
        return path


def table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def fmt_stat(s: dict[str, float], unit: str = "") -> str:
    """'0.123 s (IQR 0.11-0.13)'."""
    if not s.get("n"):
        return "-"
    return f"{s['median']:.3g}{unit} ({s['p25']:.3g}-{s['p75']:.3g})"

"""bench/results/README.md: one page over every result file (harness results inline, others listed)."""

from __future__ import annotations

import json
from pathlib import Path

from .common import results_dir


def write_summary(results: Path | None = None) -> Path:
    results = results or results_dir()
    lines = ["# Benchmark results", "", "Regenerate: `make bench` (all) or `python -m bench <name>`; see docs/performance.md.", ""]
    others = []
    for path in sorted(results.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        md = path.with_suffix(".md")
        if "figures" in data and md.exists():
            body = md.read_text().splitlines()
            lines += ["#" + body[0]] + body[1:] + [""]  # demote the page title one level
        else:
            others.append(f"- `{path.name}` ({data.get('bench', path.stem)}, {data.get('created_at', '?')}): written by its own script in bench/")
    if others:
        lines += ["## Other result files", ""] + others + [""]
    out = results / "README.md"
    out.write_text("\n".join(lines))
    return out

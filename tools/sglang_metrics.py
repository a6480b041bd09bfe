"""The pinned SGLang's Prometheus metrics, read from the wheel's source with ``ast`` (sglang is never imported).

    python -m tools.sglang_metrics                 # the wheel of tools.sglang_snapshot (downloaded if needed)
    python -m tools.sglang_metrics --wheel W.whl   # from a given wheel
    python -m tools.sglang_metrics --check         # exit 1 if the committed snapshot differs

Writes ``miles_core/rollout/sglang/metrics.json``: every ``Gauge`` / ``Counter`` / ``Histogram`` / ``Summary`` of
``sglang/srt/observability/metrics_collector.py`` built with a literal ``name=`` (its kind, documentation and the
source of its ``labelnames``), and the keys of the label dicts the collectors are built with (model_name, engine_type, tp_rank, ...).
Our engine server's /metrics (rollout/http/metrics.py) is held to it by tests/rollout/http/test_metrics.py.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import zipfile
from pathlib import Path

from tools.sglang_snapshot import ROOT, find_wheel, sglang_version

OUT = ROOT / "miles_core" / "rollout" / "sglang" / "metrics.json"
COLLECTOR = "sglang/srt/observability/metrics_collector.py"
KINDS = {"Gauge": "gauge", "Counter": "counter", "Histogram": "histogram", "Summary": "summary"}


def _kw(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def read_metrics(source: str) -> dict:
    tree = ast.parse(source, filename=COLLECTOR)
    metrics, labels = {}, {}
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        for node in ast.walk(fn):
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                    and any(isinstance(k, ast.Constant) and k.value == "engine_type" for k in node.value.keys)):
                labels.setdefault(fn.name, [k.value for k in node.value.keys if isinstance(k, ast.Constant)])
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in KINDS:
            name = _kw(node, "name")
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                doc, labelnames = _kw(node, "documentation"), _kw(node, "labelnames")
                metrics[name.value] = {"kind": KINDS[node.func.id],
                                       "documentation": doc.value if isinstance(doc, ast.Constant) else None,
                                       "labelnames": ast.unparse(labelnames) if labelnames is not None else None}
    # label_dicts: the keys of each ``labels = {"model_name": ..., "engine_type": ...}`` by the function building it
    return {"label_dicts": dict(sorted(labels.items())), "metrics": dict(sorted(metrics.items()))}


def snapshot(wheel: Path) -> dict:
    text = zipfile.ZipFile(wheel).read(COLLECTOR).decode()
    return {"sglang_version": sglang_version(), "source": COLLECTOR, "generated_by": "python -m tools.sglang_metrics",
            **read_metrics(text)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.sglang_metrics", description=__doc__.splitlines()[0])
    p.add_argument("--wheel", type=Path)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--check", action="store_true", help="exit 1 if --out differs from what the wheel gives")
    a = p.parse_args(argv)
    text = json.dumps(snapshot(a.wheel or find_wheel(sglang_version())), indent=1) + "\n"
    if a.check:
        same = a.out.is_file() and a.out.read_text() == text
        print(f"{a.out}: {'up to date' if same else 'differs from the wheel'}")
        return 0 if same else 1
    a.out.write_text(text)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

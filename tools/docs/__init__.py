"""The docs toolchain: generated reference pages and the docs check.

- ``generate``: ``docs/reference/{config,cli,metrics,env}.md`` from the pydantic config, the typer
  app, the metrics catalog (``miles_core/tracking/catalog.py``), ``miles_core/env.py`` and ``flows/env.py``.
- ``check``: every flag, config key, env var, path, module path, metric name and runnable
  command in the docs (and README.md) is checked against the code.
- ``emitted``: the metric names the code can emit, by a static scan of the emitter modules.

``python -m tools.docs generate | check | build`` (``make docs`` runs generate, check and build).
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

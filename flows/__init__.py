"""Prefect flows: train, evaluate, convert, export. Importing this package configures the
environment (caches, telemetry, Prefect home) before Prefect itself is imported."""

import sys

from flows.env import configure_environment

try:
    configure_environment()
except ValueError as e:  # a bad value of a variable miles reads (MILES_ALLOW_HUB): one line, exit 2 like any input error
    print(f"error: {e}", file=sys.stderr)
    raise SystemExit(2) from None

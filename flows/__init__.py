"""Prefect flows: train, evaluate, convert, export. Importing this package configures the
environment (caches, telemetry, Prefect home) before Prefect itself is imported."""

from miles_core.env import configure_environment

configure_environment()

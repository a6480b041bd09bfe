"""Tests of miles_core.algorithms (mirrors the package)."""

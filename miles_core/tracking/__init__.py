"""Tracking: MLflow primary; key sanitizer; step axes."""

from .keys import flatten, prefix_collisions, sanitize_key
from .mlflow_tracker import MlflowTracker

__all__ = ["MlflowTracker", "flatten", "prefix_collisions", "sanitize_key"]

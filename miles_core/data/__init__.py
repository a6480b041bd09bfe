"""Samples, prompt datasets and the data source."""

from .dataset import DataError, Prompt, PromptSpec, load_prompts, read_rows, split_slice
from .sample import Sample, Status
from .source import Cursor, DataSource

__all__ = ["Cursor", "DataError", "DataSource", "Prompt", "PromptSpec", "Sample", "Status", "load_prompts", "read_rows", "split_slice"]

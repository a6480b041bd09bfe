"""Samples, prompt datasets and the data source."""

from .dataset import DataError, Prompt, PromptSpec, check_rows, load_prompts, read_rows, split_slice
from .sample import Sample, Status
from .source import Cursor, DataSource

__all__ = ["Cursor", "DataError", "DataSource", "Prompt", "PromptSpec", "check_rows", "Sample", "Status", "load_prompts", "read_rows", "split_slice"]

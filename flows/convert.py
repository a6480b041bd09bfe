"""The convert flow: resolve and validate an initial model for the torch backend (cached on inputs)."""

from __future__ import annotations

from prefect import flow

from miles_core.env import cache_dir
from tasks.convert import convert as convert_task


@flow(name="convert")
def convert(hf_checkpoint: str) -> dict:
    return convert_task(hf_checkpoint, str(cache_dir()))

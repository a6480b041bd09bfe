"""Prompt datasets: jsonl or parquet, ``path@[start:end]`` slices, reference keys, chat template,
over-long prompts dropped and counted. Errors name the file and the row.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_SLICE = re.compile(r"^(?P<path>.+?)@\[(?P<start>-?\d*):(?P<end>-?\d*)\]$")


class DataError(ValueError):
    """Bad prompt data; the message names the file and the row or key."""


@dataclass(frozen=True)
class Prompt:
    """One prompt row: rendered text, its token ids, label and metadata."""

    text: str | list[dict[str, Any]]
    input_ids: list[int]
    label: Any
    metadata: dict[str, Any] = field(default_factory=dict)


def split_slice(spec: str) -> tuple[Path, slice]:
    m = _SLICE.match(spec)
    if not m:
        return Path(spec), slice(None)
    to_int = lambda s: int(s) if s else None  # noqa: E731
    return Path(m["path"]), slice(to_int(m["start"]), to_int(m["end"]))


def read_rows(spec: str) -> list[dict[str, Any]]:
    """Rows of a jsonl or parquet file, sliced by ``@[a:b]``."""
    return [row for _, row in read_numbered_rows(spec)]


def read_numbered_rows(spec: str) -> list[tuple[int, dict[str, Any]]]:
    """(1-based line of a jsonl, or 1-based row of a parquet file, row) pairs, sliced by ``@[a:b]``."""
    path, sl = split_slice(spec)
    if not path.exists():
        raise DataError(f"prompt data file not found: {path}")
    if path.is_dir():
        raise DataError(f"prompt data {path} is a directory; expected a jsonl or parquet file")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow raises several types for a bad file
            raise DataError(f"{path}: not a readable parquet file: {e}") from None
        return list(enumerate(rows, start=1))[sl]
    out = []
    for lineno, raw in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{path}:{lineno}: not UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1})") from None
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{lineno}: malformed JSON: {e.msg}") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
        out.append((lineno, row))
    return out[sl]


@dataclass(frozen=True, kw_only=True)
class PromptSpec:
    input_key: str = "input"
    label_key: str | None = "label"
    metadata_key: str = "metadata"
    tool_key: str | None = None
    apply_chat_template: bool = False
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    max_prompt_len: int | None = None
    max_prompt_len_reason: str = "rollout_max_prompt_len"  # where the limit comes from, as errors and logs name it
    tools: tuple | None = None  # tool specs for the chat template of a row without tool_key (generate_tool_specs_path)


def load_prompts(spec_path: str, tokenizer, spec: PromptSpec) -> tuple[list[Prompt], int]:
    """-> (prompts, number dropped for exceeding max_prompt_len). Bad rows fail naming the file and 1-based line."""
    rows = read_numbered_rows(spec_path)
    prompts, dropped = [], 0
    for lineno, row in rows:
        where = f"{split_slice(spec_path)[0]}:{lineno}"
        check_row(where, row, spec)
        ids = _encode(row[spec.input_key], tokenizer, spec, row)
        if spec.max_prompt_len is not None and len(ids) > spec.max_prompt_len:
            dropped += 1
            continue
        label = row[spec.label_key] if spec.label_key else None
        prompts.append(Prompt(text=row[spec.input_key], input_ids=ids, label=label, metadata=row.get(spec.metadata_key) or {}))
    if not prompts:
        raise DataError(f"{spec_path}: no usable prompts ({len(rows)} rows, {dropped} longer than {spec.max_prompt_len} "
                        f"tokens: {spec.max_prompt_len_reason}); shorten the prompts or raise the limit")
    return prompts, dropped


def check_rows(spec_path: str, spec: PromptSpec) -> int:
    """Read and check every row of a prompt file without a tokenizer (the run's preflight). -> the row count."""
    rows = read_numbered_rows(spec_path)
    for lineno, row in rows:
        check_row(f"{split_slice(spec_path)[0]}:{lineno}", row, spec)
    if not rows:
        raise DataError(f"{spec_path}: no rows")
    return len(rows)


def check_row(where: str, row: dict[str, Any], spec: PromptSpec) -> None:
    """Keys and types of one row; ``where`` is ``file:line``."""
    if spec.input_key not in row:
        raise DataError(f"{where}: row has no input key {spec.input_key!r} (keys: {sorted(row)})")
    if spec.label_key is not None and spec.label_key not in row:
        raise DataError(f"{where}: row has no label key {spec.label_key!r} (keys: {sorted(row)})")
    text = row[spec.input_key]
    if spec.apply_chat_template and not isinstance(text, (str, list)):
        raise DataError(f"{where}: {spec.input_key!r} must be a string or a list of messages, got {type(text).__name__}")
    if not spec.apply_chat_template and not isinstance(text, str):
        raise DataError(f"{where}: {spec.input_key!r} must be a string without apply_chat_template, got {type(text).__name__}")
    metadata = row.get(spec.metadata_key) or {}
    if not isinstance(metadata, dict):
        raise DataError(f"{where}: {spec.metadata_key!r} must be an object, got {type(metadata).__name__}")


def _encode(text, tokenizer, spec: PromptSpec, row: dict) -> list[int]:
    if spec.apply_chat_template:
        messages = text if isinstance(text, list) else [{"role": "user", "content": text}]
        tools = row.get(spec.tool_key) if spec.tool_key and row.get(spec.tool_key) is not None else spec.tools
        tools = list(tools) if tools is not None else None
        rendered = tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True, **spec.apply_chat_template_kwargs
        )
        return tokenizer(rendered, add_special_tokens=False)["input_ids"]
    return tokenizer(text, add_special_tokens=False)["input_ids"]

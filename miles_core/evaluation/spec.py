"""Which eval datasets a run evaluates, and with what settings: `eval_prompt_data` name path pairs
and/or an `eval_config` YAML file (the reference's format)::

    eval:                                  # optional wrapper key
      defaults:                            # any dataset field except name and path
        n_samples_per_eval_prompt: 4
        max_response_len: 64
      datasets:                            # a list, or a mapping name -> fields
        - name: aime
          path: /data/aime-2024.jsonl      # jsonl or parquet, path@[a:b] slices, builtin://<task>
          rm_type: deepscaler
          input_key: prompt                # prompt_key is accepted as the reference's spelling
          label_key: label
          n_samples_per_eval_prompt: 16
          temperature: 0.6                 # top_p, top_k, max_response_len, min_new_tokens, stop, stop_token_ids
          metadata_overrides: {split: test}

A field resolves, first set wins: the dataset's value, then ``defaults``, then the run's flags
(``n_samples_per_eval_prompt``, ``eval_temperature``, ``eval_top_p``, ``eval_top_k``,
``eval_max_response_len``, ``eval_min_new_tokens``, ``eval_reward_key``, ``eval_input_key``, ``eval_label_key``, ``eval_tool_key``), then the rollout's values (sampling, ``rm_type``,
``input_key`` / ``label_key`` / ``metadata_key`` / ``tool_key``). Pair datasets take the run's values.
Pure: parses and resolves, never tokenizes or loads a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from miles_core.config import ConfigError, TrainConfig


class _Fields(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    rm_type: str | None = None
    input_key: str | None = None
    label_key: str | None = None
    metadata_key: str | None = None
    tool_key: str | None = None
    n_samples_per_eval_prompt: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, gt=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = None
    max_response_len: int | None = Field(None, ge=1)
    min_new_tokens: int | None = Field(None, ge=0)
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    metadata_overrides: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _prompt_key(cls, data: Any) -> Any:
        if isinstance(data, dict) and "prompt_key" in data:
            data = dict(data)
            key = data.pop("prompt_key")
            data.setdefault("input_key", key)
        return data


class EvalDatasetSpec(_Fields):
    """One dataset entry of an eval config file."""

    name: str = Field(min_length=1)
    path: str = Field(min_length=1)


class EvalFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    defaults: _Fields = Field(default_factory=_Fields)
    datasets: list[EvalDatasetSpec] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _named_mapping(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("datasets"), dict):
            data = {**data, "datasets": [{"name": k, **(v or {})} for k, v in data["datasets"].items()]}
        return data


class ResolvedDataset(BaseModel):
    """Every setting of one eval dataset, resolved (None only where the run's value is None too)."""

    model_config = ConfigDict(frozen=True)

    name: str
    path: str
    rm_type: str
    input_key: str
    label_key: str | None
    metadata_key: str
    tool_key: str | None
    n_samples: int
    temperature: float
    top_p: float
    top_k: int
    max_response_len: int
    min_new_tokens: int
    stop: list[str] | None
    stop_token_ids: list[int] | None
    metadata_overrides: dict[str, Any]


def read_eval_file(path: str | Path) -> EvalFile:
    """Parse and validate an eval config YAML; errors name the file and the field."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"eval_config {path}: no such file")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"eval_config {path}: not valid YAML: {e}") from None
    if isinstance(data, dict) and "eval" in data:
        data = data["eval"]
    try:
        return EvalFile.model_validate(data)
    except ValidationError as e:
        lines = [f"  - {'.'.join(str(x) for x in err['loc']) or 'file'}: {err['msg']}" for err in e.errors()]
        raise ConfigError(f"eval_config {path}: invalid:\n" + "\n".join(lines)) from None


def resolve_datasets(cfg: TrainConfig) -> list[ResolvedDataset]:
    """The run's eval datasets: name path pairs first, then the eval config file's; names unique."""
    e, r, d = cfg.eval, cfg.rollout, cfg.data
    run = {
        "rm_type": r.rm_type, "input_key": _first(e.eval_input_key, d.input_key), "label_key": _first(e.eval_label_key, d.label_key),
        "metadata_key": d.metadata_key,
        "tool_key": _first(e.eval_tool_key, d.tool_key), "n_samples_per_eval_prompt": e.n_samples_per_eval_prompt,
        "temperature": _first(e.eval_temperature, r.rollout_temperature), "top_p": _first(e.eval_top_p, r.rollout_top_p),
        "top_k": _first(e.eval_top_k, r.rollout_top_k), "max_response_len": _first(e.eval_max_response_len, r.rollout_max_response_len),
        "min_new_tokens": _first(e.eval_min_new_tokens, 0), "stop": r.rollout_stop, "stop_token_ids": r.rollout_stop_token_ids, "metadata_overrides": {},
    }
    entries: list[tuple[EvalDatasetSpec, _Fields]] = []
    pairs = e.eval_prompt_data or []
    entries += [(EvalDatasetSpec(name=n, path=p), _Fields()) for n, p in zip(pairs[::2], pairs[1::2])]
    if e.eval_config:
        f = read_eval_file(e.eval_config)
        entries += [(ds, f.defaults) for ds in f.datasets]
    out, seen = [], set()
    for ds, defaults in entries:
        if ds.name in seen:
            raise ConfigError(f"eval dataset {ds.name!r} is defined twice (eval_prompt_data and/or eval_config); names must be unique")
        seen.add(ds.name)
        values = {k: _first(getattr(ds, k), getattr(defaults, k), v) for k, v in run.items()}
        values["n_samples"] = values.pop("n_samples_per_eval_prompt")
        out.append(ResolvedDataset(name=ds.name, path=ds.path, **values))
    return out


def _first(*values):
    return next((v for v in values if v is not None), None)

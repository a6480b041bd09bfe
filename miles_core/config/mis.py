"""Settings of the built-in MIS correction (``custom_tis_function_path: mis``), read from the YAML at
``custom_config_path``: torch-free, so a config validates them at load without importing the math
(miles_core/algorithms/mis.py, which re-exports these names)."""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

Level = Literal["token", "sequence", "geometric"]
MIS_NAMES = ("mis", "miles_core.algorithms.mis.compute_mis_weights")  # how custom_tis_function_path names it


class MISConfig(BaseModel):
    """Settings of the built-in MIS function (the YAML at custom_config_path)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)  # bounds are finite numbers

    use_tis: bool = Field(True, description="Apply the IS weights (false: log the mismatch metrics only).")
    tis_mode: Literal["truncate", "clip", "mask"] = Field("truncate", description="How IS weights are bounded.")
    tis_level: Level = Field("token", description="Aggregation level of the IS log weight.")
    tis_lower_bound: float | None = Field(
        None, ge=0, description="Lower IS bound (clip, mask); default 1/tis_upper_bound."
    )
    tis_upper_bound: float = Field(2.0, gt=0, description="Upper IS bound.")
    use_rs: bool = Field(False, description="Rejection sampling: drop tokens whose rs-level weight is out of bounds.")
    rs_level: Level = Field("token", description="Aggregation level of the rejection weight.")
    rs_lower_bound: float | None = Field(None, ge=0, description="Lower rejection bound; default the IS lower bound.")
    rs_upper_bound: float | None = Field(None, gt=0, description="Upper rejection bound; default tis_upper_bound.")
    rs_veto_threshold: float | None = Field(
        1e-4, gt=0, description="With use_rs: mask a sample with any token ratio below this (null = off)."
    )
    tis_batch_normalize: bool = Field(
        False, description="Divide the weights by their mean over the originally trainable tokens of the micro-batch."
    )

    @model_validator(mode="after")
    def _bounds_ordered(self) -> MISConfig:
        if self.lower >= self.tis_upper_bound:
            raise ValueError(f"tis_lower_bound={self.lower} must be < tis_upper_bound={self.tis_upper_bound}")
        if self.rs_lower > self.rs_upper:
            raise ValueError(f"rs_lower_bound={self.rs_lower} must be <= rs_upper_bound={self.rs_upper}")
        if self.tis_batch_normalize and self.tis_level == "geometric":
            raise ValueError("tis_batch_normalize is undefined at tis_level geometric (as in the reference); "
                             "use tis_level token or sequence, or drop tis_batch_normalize")
        return self

    @property
    def lower(self) -> float:
        return 1.0 / self.tis_upper_bound if self.tis_lower_bound is None else self.tis_lower_bound

    @property
    def rs_lower(self) -> float:
        return self.lower if self.rs_lower_bound is None else self.rs_lower_bound

    @property
    def rs_upper(self) -> float:
        return self.tis_upper_bound if self.rs_upper_bound is None else self.rs_upper_bound


@functools.lru_cache(maxsize=16)
def load_options(path: str | None) -> Mapping[str, Any]:
    """The YAML mapping at `custom_config_path` (read once per path), read-only; {} for None."""
    if path is None:
        return types.MappingProxyType({})
    with open(path, encoding="utf-8") as handle:
        data = yaml.safe_load(handle) or {}
    if not isinstance(data, dict):
        raise ValueError(f"custom_config_path={path!r}: expected a YAML mapping of settings, got {type(data).__name__}")
    return types.MappingProxyType(data)

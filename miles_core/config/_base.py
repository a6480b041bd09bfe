"""Shared base for the argument groups: frozen, unknown keys forbidden."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Group(BaseModel):
    """One argument group. Every field keeps the reference system's name and default."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

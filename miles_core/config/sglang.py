"""SGLang engine arguments (rollout_engine: sglang): server passthrough and the reference's router flags.

A passthrough is any key ``sglang_<server argument>`` (CLI ``--sglang-<flag> [value]``): the loader
collects them into ``sglang_server_args`` ({argument: value}), checked against the pinned SGLang's
ServerArgs snapshot (miles_core/config/server_args.py; the list: docs/reference/sglang.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from ._base import Group
from .server_args import validate


class SglangConfig(Group):
    """SGLang engines (rollout_engine sglang): server arguments and the router; unused by the other engines."""

    sglang_server_args: dict[str, Any] = Field(
        default_factory=dict, description="SGLang server arguments passed to every engine's `python -m sglang.launch_server`, "
        "by ServerArgs field name; set them as sglang_<field> keys or --sglang-<flag> flags (the reference's form). Checked at "
        "load against the pinned SGLang's arguments (docs/reference/sglang.md): unknown names, wrong types and arguments miles "
        "sets itself (model path, host, port, tp size, api key) fail. Only with rollout_engine sglang.")
    sglang_router_ip: str | None = Field(None, description="Address of an SGLang router already running (not supported yet: miles routes with its own router).")
    sglang_router_port: int | None = Field(None, ge=1, description="Port of an SGLang router already running (not supported yet, see sglang_router_ip).")
    sglang_router_policy: Literal["round_robin", "random", "power_of_two"] | None = Field(
        None, description="How the router picks an engine for each chunk, of the SGLang router's policies: round_robin, random, "
        "power_of_two (the less loaded of two drawn at random); None: the one with the fewest requests in flight (the "
        "reference's MilesRouter). cache_aware, consistent_hashing and the other prefix-keyed policies are not implemented.")
    sglang_router_request_timeout_secs: int = Field(14400, ge=1, description="Seconds a generate request to an engine may take before it counts as failed (the engine client's read timeout; miles_router_timeout overrides it).")
    sglang_server_concurrency: int = Field(
        512, ge=1, description="Requests (samples) in flight per engine: the router sends at most this many times the number "
        "of engines at once, in chunks no larger, and holds the rest back (the reference's rollout semaphore).")
    # ---- miles' router (the reference's MilesRouter: least in-flight requests, failure quarantine)
    miles_router_timeout: float | None = Field(
        None, gt=0, description="Seconds one request from the router to an engine may take (its HTTP read timeout); "
        "None: sglang_router_request_timeout_secs.")
    miles_router_max_connections: int | None = Field(
        None, ge=1, description="Requests in flight from the router over all engines at most (None: sglang_server_concurrency "
        "times the number of engines, the reference's default); the lower of the two bounds applies.")
    miles_router_health_check_failure_threshold: int = Field(
        3, ge=1, description="Consecutive failed requests after which the router takes an engine out of routing (a failed "
        "health probe takes it out at once); it is probed again and rejoins when it answers.")

    @field_validator("sglang_server_args")
    @classmethod
    def _known_server_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        return validate(value)

"""The event logger's fields' cross-field rules (save_debug_event_data, save_local_weight_checksum, enable_event_analyzer,
env_report; miles_core/runtime/events.py, docs/guide/coming-from-the-reference.md), checked by rules.check_rules."""

from __future__ import annotations

import base64
import binascii
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .train import TrainConfig


ENV_REPORT_ENV = "MILES_SCRIPT_ENV_REPORT"  # env_report's default, as the reference's


def decode_env_report(raw: str) -> dict | None:
    """The launcher's report: base64 of a JSON object, or the JSON object itself, as the reference's decode_env_report
    (miles/utils/env_report.py); None when empty. Raises ValueError for anything else (the reference only warns)."""
    if not raw:
        return None
    try:
        text = base64.b64decode(raw, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        text = raw
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"env_report {raw[:60]!r} is neither a JSON object nor base64 of one (the launcher's report; its "
                         "default is $MILES_SCRIPT_ENV_REPORT): fix the value, or set env_report: '' to collect nothing")
    return value


def event_rules(c: "TrainConfig") -> None:
    m = c.misc
    decode_env_report(m.env_report)
    if m.dump_details is not None and m.save_debug_event_data is not None:
        raise ValueError(f"dump_details sets save_debug_event_data itself ({m.dump_details}/events): drop one of them")
    needs_dir = [n for n in ("save_local_weight_checksum", "enable_event_analyzer") if getattr(m, n)]
    if needs_dir and m.event_dir is None:
        raise ValueError(f"{', '.join(needs_dir)} write and read the run's events: set save_debug_event_data (an event dir) "
                         "or dump_details too")
    if not m.save_local_weight_checksum:
        return
    if m.debug_rollout_only or m.train_only or m.debug_skip_weight_update:
        raise ValueError("save_local_weight_checksum records each weight sync, and debug_rollout_only / debug_train_only / "
                         "debug_skip_weight_update send none: drop one of them")
    if c.cluster.rollout_engine == "sglang":
        raise ValueError("save_local_weight_checksum with rollout_engine sglang is not supported yet: SGLang's /weights_checker "
                         "checksum hashes with its own tensor_hash, not the sha256 of the bytes the trainer records, so the "
                         "two never compare; use rollout_engine hf (our engines, in process or over HTTP)")
    if c.lora.lora_sync_from_tensor:
        raise ValueError("save_local_weight_checksum with lora_sync_from_tensor is not supported yet: the trainer sends the "
                         "adapter alone while the engines hold the merged model; use check_lora_weight_equal for adapter syncs")

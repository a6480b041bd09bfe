"""Names on disk, `CheckpointInfo`, and the completeness checks readers use.

A save dir:

    <save_dir>/
      latest                      text: the rollout id of the last checkpoint saved (written last)
      <rollout_id>/               one complete checkpoint (decimal name, no padding)
        model/model.safetensors   model.state_dict(); tied tensors stored once (see _tensors.py)
        model/config.json         model.config, when the model has one (for humans and converters)
        optimizer.pt              optimizer.state_dict() (torch.save), unless save_optim=False
        rng.pt                    capture_rng_state() (torch.save)
        extra/<name>.safetensors  extra modules (critic, value head, ...)
        extra/<name>.optimizer.pt their optimizers' state_dict() (torch.save), unless save_optim=False
        meta.json                 caller's state + rollout_id + format_version + created_at + contents
        .complete                 JSON manifest {files: {relative path: bytes}}, written last
      .tmp-<rollout_id>-<pid>/    a save in progress (or one killed mid-write): skipped, reported
      .trash-<name>-<pid>/        a directory being deleted: skipped, reported
      debug_events/<rollout_id>/  the event dir as of that checkpoint (save_debug_event_data; runtime/events.py): not scanned

A checkpoint dir is complete when its `.complete` manifest matches the files on disk, `meta.json`
parses and names the same rollout id, and the required files exist (`checkpoint_problem`).
Everything else found in a save dir is skipped with a warning naming it and the reason.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from miles_core.checkpoint._fs import TMP_PREFIX, TRASH_PREFIX, marker_problem
from miles_core.checkpoint.errors import CheckpointError

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
LATEST = "latest"
MODEL_FILE = "model/model.safetensors"
MODEL_CONFIG = "model/config.json"
OPTIMIZER_FILE = "optimizer.pt"
RNG_FILE = "rng.pt"
META_FILE = "meta.json"
EXTRA_DIR = "extra"
EXTRA_OPTIMIZER_SUFFIX = ".optimizer.pt"
RESERVED_META_KEYS = ("rollout_id", "format_version", "created_at", "contents")
NOT_CHECKPOINTS = ("debug_events",)  # dirs of a save dir that hold no checkpoint, skipped without a warning


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint: its directory, rollout id and parsed `meta.json`."""

    path: Path
    rollout_id: int
    meta: dict
    verified: bool = False  # every file's SHA-256 checked against the manifest (find_latest does it)


def extra_optimizer_file(name: str) -> str:
    """Relative path of the state of extra optimizer `name` (e.g. the PPO critic's AdamW)."""
    return f"{EXTRA_DIR}/{name}{EXTRA_OPTIMIZER_SUFFIX}"


def check_rollout_id(rollout_id: object) -> None:
    """Raise unless `rollout_id` is a non-negative int (bool excluded)."""
    if not isinstance(rollout_id, int) or isinstance(rollout_id, bool) or rollout_id < 0:
        raise CheckpointError(f"rollout_id must be a non-negative int, got {rollout_id!r}")


def parse_rollout_id(name: str) -> int | None:
    """`"12"` -> 12; anything that is not a canonical non-negative decimal -> None."""
    return int(name) if name.isdigit() and str(int(name)) == name else None


def checkpoint_problem(path: Path) -> str | None:
    """Why `path` is not a complete checkpoint dir, or None."""
    problem = marker_problem(path)
    if problem:
        return problem
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, ValueError) as e:
        return f"unreadable {META_FILE} ({e})"
    if meta.get("rollout_id") != parse_rollout_id(path.name):
        return f"{META_FILE} says rollout_id={meta.get('rollout_id')!r}, dir name is {path.name!r}"
    contents = meta.get("contents", {})
    required = [MODEL_FILE, RNG_FILE] + ([OPTIMIZER_FILE] if contents.get("optimizer") else [])
    required += [extra_optimizer_file(n) for n in contents.get("extra_optimizers", [])]
    missing = [f for f in required if not (path / f).is_file()]
    return f"missing {missing}" if missing else None


def read_info(path: Path) -> CheckpointInfo:
    meta = json.loads((path / META_FILE).read_text())
    return CheckpointInfo(path=path, rollout_id=meta["rollout_id"], meta=meta)


def scan_numbered_dirs(root: Path, problem: Callable[[Path], str | None], what: str) -> list[tuple[int, Path]]:
    """Complete `<root>/<int>/` dirs, ascending; every other directory is reported and skipped."""
    if not root.is_dir():
        return []
    found = []
    for entry in sorted(root.iterdir()):
        if not entry.is_dir() or entry.name in NOT_CHECKPOINTS:
            continue
        rollout_id = parse_rollout_id(entry.name)
        if entry.name.startswith(TMP_PREFIX):
            reason = "temporary dir of an unfinished or interrupted write"
        elif entry.name.startswith(TRASH_PREFIX):
            reason = "leftover of an interrupted delete or replace"
        elif rollout_id is None:
            reason = "name is not a rollout id"
        else:
            reason = problem(entry)
        if reason:
            logger.warning("skipping %s %s: %s", what, entry, reason)
            continue
        found.append((rollout_id, entry))
    return sorted(found)

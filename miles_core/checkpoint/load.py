"""Find and load checkpoints written by `save_checkpoint` (layout in layout.py).

Readers never trust a directory name alone: `list_checkpoints` returns only complete checkpoints
(marker manifest matches, meta.json parses, required files present) and logs one warning per
skipped directory naming it and the reason. `find_latest` follows the `latest` pointer when it
names a complete checkpoint, and otherwise falls back, with a warning, to the newest complete one
(the pointer may lag behind a checkpoint whose save was interrupted before the pointer moved).
"""

from __future__ import annotations

import json
import logging
import pickle
from dataclasses import replace
from pathlib import Path

import torch

from miles_core.checkpoint import layout
from miles_core.checkpoint._fs import checksum_problem
from miles_core.checkpoint._tensors import load_into
from miles_core.checkpoint.errors import CheckpointError
from miles_core.checkpoint.layout import CheckpointInfo
from miles_core.checkpoint.rng import restore_rng_state

logger = logging.getLogger(__name__)


def list_checkpoints(save_dir: Path) -> list[CheckpointInfo]:
    """Complete checkpoints under `save_dir`, ascending rollout id; [] when the dir is missing."""
    found = layout.scan_numbered_dirs(Path(save_dir), layout.checkpoint_problem, "checkpoint dir")
    return [layout.read_info(path) for _, path in found]


def find_latest(save_dir: Path) -> CheckpointInfo | None:
    """The checkpoint named by `latest` if complete, else the newest complete one, else None; its files'
    checksums verified: a corrupted one is skipped with a warning naming the file, the next older used."""
    save_dir = Path(save_dir)
    complete = list_checkpoints(save_dir)
    if not complete:
        return None
    pointer = save_dir / layout.LATEST
    text = pointer.read_text().strip() if pointer.is_file() else None
    by_id = {info.rollout_id: info for info in complete}
    pointed = layout.parse_rollout_id(text) if text is not None else None
    if pointed not in by_id:
        why = "is missing" if text is None else f"names {text!r}, which is not a complete checkpoint"
        logger.warning("%s %s; using the newest complete checkpoint %s", pointer, why, complete[-1].path)
    order = ([by_id[pointed]] if pointed in by_id else []) + [i for i in reversed(complete) if i.rollout_id != pointed]
    for info in order:
        problem = checksum_problem(info.path)
        if problem is None:
            return replace(info, verified=True)
        logger.warning("skipping checkpoint %s: %s", info.path, problem)
    return None


def load_checkpoint(
    info: CheckpointInfo,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    extra_modules: dict[str, torch.nn.Module] | None = None,
    restore_rng: bool = True,
    extra_optimizers: dict[str, torch.optim.Optimizer] | None = None,
) -> dict:
    """Load weights (strict), extra modules, optimizer states, then RNG; return meta.json.

    The model must already be built with the same architecture (tied embeddings stay tied: the
    values are copied into the existing parameters). Optimizer state is loaded only when the
    checkpoint has it and `optimizer` is given; a checkpoint without it logs a warning. The same
    holds for each of `extra_optimizers`, by name (a checkpoint from before extra optimizers were
    saved, or saved with save_optim=False, leaves them fresh, with a warning).
    """
    path = Path(info.path)
    problem = layout.checkpoint_problem(path) or (None if info.verified else checksum_problem(path))
    if problem:
        raise CheckpointError(f"{path}: not a complete checkpoint: {problem}")
    meta = json.loads((path / layout.META_FILE).read_text())
    load_into(model, path / layout.MODEL_FILE)
    _load_extras(path, meta, extra_modules or {})
    if optimizer is not None:
        _load_optimizer(path, layout.OPTIMIZER_FILE, optimizer)
    for name, opt in (extra_optimizers or {}).items():
        _load_optimizer(path, layout.extra_optimizer_file(name), opt)
    if restore_rng:
        restore_rng_state(torch.load(path / layout.RNG_FILE, weights_only=True))
    return meta


def _load_extras(path: Path, meta: dict, extra_modules: dict[str, torch.nn.Module]) -> None:
    saved = meta["contents"]["extra"]
    missing = sorted(set(extra_modules) - set(saved))
    if missing:
        raise CheckpointError(f"{path}: no extra module(s) {missing}; checkpoint has {saved}")
    for name, module in extra_modules.items():
        load_into(module, path / layout.EXTRA_DIR / f"{name}.safetensors")


def _load_optimizer(path: Path, relative: str, optimizer: torch.optim.Optimizer) -> None:
    file = path / relative
    if not file.is_file():
        logger.warning("%s has no %s; that optimizer starts from fresh state", path, relative)
        return
    try:
        optimizer.load_state_dict(torch.load(file, map_location="cpu", weights_only=True))
    except (ValueError, KeyError, RuntimeError, pickle.UnpicklingError) as e:
        raise CheckpointError(f"{file}: does not match the optimizer: {e}") from e

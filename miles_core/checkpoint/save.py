"""`save_checkpoint`: write one checkpoint atomically, move `latest`, apply retention.

Order of operations (layout in layout.py):

1. Check inputs (rollout id, JSON-serialisable state, reserved keys, extra names) — nothing is
   written when they are bad.
2. Write everything into `<save_dir>/.tmp-<rollout_id>-<pid>/`: model, optimizer, RNG, extra
   modules and their optimizers, meta.json; then `.complete` (fsyncs every file first; the marker is the last write).
3. Rename the temp dir to `<save_dir>/<rollout_id>/` (an existing one is swapped out atomically,
   see `_fs.replace_dir`), fsync `<save_dir>`.
4. Atomically rewrite `<save_dir>/latest` with the rollout id.
5. Retention (`keep_last=N`): among complete checkpoints with id <= the saved one, keep the N
   newest (the saved one always counts) and delete the rest. Newer ids are never touched.

Any exception in 1-3 removes the temp dir and propagates; previous checkpoints and `latest` are
untouched. An exception in 4 leaves the new checkpoint complete on disk and `latest` at its old
value, which is still a consistent state. Single writer per save dir (rank 0).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import torch

from miles_core.checkpoint import layout
from miles_core.checkpoint._fs import (
    TMP_PREFIX,
    atomic_write_text,
    naming_full_disk,
    remove_tree,
    replace_dir,
    tensor_bytes,
    write_bytes_durable,
    write_marker,
)
from miles_core.checkpoint._tensors import save_state_dict
from miles_core.finite import check_weights
from miles_core.checkpoint.errors import CheckpointError
from miles_core.checkpoint.layout import CheckpointInfo
from miles_core.checkpoint.load import list_checkpoints
from miles_core.checkpoint.rng import capture_rng_state

_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def save_checkpoint(
    save_dir: Path,
    rollout_id: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    state: dict,
    keep_last: int | None = None,
    save_optim: bool = True,
    extra_tensors: dict[str, torch.nn.Module] | None = None,
    extra_optimizers: dict[str, torch.optim.Optimizer] | None = None,
    rng_state: dict | None = None,
) -> CheckpointInfo:
    """Save model (+ optimizer, RNG, extra modules and their optimizers, `state`) as `<save_dir>/<rollout_id>/`.

    `state` must be JSON-serialisable; it becomes meta.json together with rollout_id,
    format_version, created_at and contents. `extra_optimizers` (e.g. {"critic": its AdamW}) are
    written like `optimizer`, and like it skipped with save_optim=False. `rng_state` (capture_rng_state()'s) is the
    RNG state to store, by default the current one (an asynchronous save captured it when it was asked for).
    Returns the new checkpoint's info.
    """
    save_dir = Path(save_dir)
    extra_tensors = extra_tensors or {}
    for part in [model, *extra_tensors.values()]:  # never a checkpoint of non-finite weights
        check_weights(part.state_dict().items(), f"checkpoint {rollout_id} in {save_dir}")
    extra_optimizers = (extra_optimizers or {}) if save_optim else {}
    meta = _build_meta(rollout_id, state, optimizer is not None and save_optim, extra_tensors, extra_optimizers, keep_last)
    save_dir.mkdir(parents=True, exist_ok=True)
    tmp = save_dir / f"{TMP_PREFIX}{rollout_id}-{os.getpid()}"
    final = save_dir / str(rollout_id)
    for stale in save_dir.glob(f"{TMP_PREFIX}{rollout_id}-*"):  # left by a killed earlier save of this id
        remove_tree(stale)
    needed = tensor_bytes([model.state_dict(), optimizer.state_dict() if optimizer is not None and save_optim else None,
                           [m.state_dict() for m in extra_tensors.values()], [o.state_dict() for o in extra_optimizers.values()]])
    try:
        tmp.mkdir()
        with naming_full_disk(final, needed):
            _write_contents(tmp, model, optimizer if save_optim else None, extra_tensors, extra_optimizers, meta,
                            rng_state if rng_state is not None else capture_rng_state())
            write_marker(tmp)
        replace_dir(tmp, final)
    except BaseException:
        remove_tree(tmp)
        raise
    atomic_write_text(save_dir / layout.LATEST, f"{rollout_id}\n")
    if keep_last is not None:
        _apply_retention(save_dir, rollout_id, keep_last)
    return CheckpointInfo(path=final, rollout_id=rollout_id, meta=meta)


def _build_meta(rollout_id: int, state: dict, has_optimizer: bool, extras: dict, extra_optims: dict, keep_last: int | None) -> dict:
    """Validate the request and build meta.json's content (raises CheckpointError)."""
    layout.check_rollout_id(rollout_id)
    if keep_last is not None and keep_last < 1:
        raise CheckpointError(f"keep_last must be >= 1 or None, got {keep_last!r}")
    bad_names = [n for n in [*extras, *extra_optims] if not _SAFE_NAME.match(n)]
    if bad_names:
        raise CheckpointError(f"extra_tensors names and extra_optimizers names must match {_SAFE_NAME.pattern}: {bad_names}")
    reserved = [k for k in layout.RESERVED_META_KEYS if k in state]
    clashes = [k for k in reserved if not (k == "rollout_id" and state[k] == rollout_id)]  # repeating the id is fine
    if clashes:
        raise CheckpointError(f"state uses reserved meta.json keys {clashes}; rename them")
    try:
        json.dumps(state, allow_nan=True)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"state must be JSON-serialisable for {layout.META_FILE}: {e}") from e
    return {
        **state,
        "rollout_id": rollout_id,
        "format_version": layout.FORMAT_VERSION,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "contents": {"optimizer": has_optimizer, "extra": sorted(extras), "extra_optimizers": sorted(extra_optims)},
    }


def _write_contents(
    tmp: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, extras: dict, extra_optims: dict, meta: dict,
    rng_state: dict,
) -> None:
    (tmp / "model").mkdir()
    save_state_dict(model.state_dict(), tmp / layout.MODEL_FILE)
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        text = json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str)
        write_bytes_durable(tmp / layout.MODEL_CONFIG, text.encode())
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / layout.OPTIMIZER_FILE)
    torch.save(rng_state, tmp / layout.RNG_FILE)
    if extras or extra_optims:
        (tmp / layout.EXTRA_DIR).mkdir()
    for name, module in extras.items():
        save_state_dict(module.state_dict(), tmp / layout.EXTRA_DIR / f"{name}.safetensors")
    for name, opt in extra_optims.items():
        torch.save(opt.state_dict(), tmp / layout.extra_optimizer_file(name))
    write_bytes_durable(tmp / layout.META_FILE, json.dumps(meta, indent=2, sort_keys=True).encode())


def _apply_retention(save_dir: Path, saved_id: int, keep_last: int) -> None:
    """Delete complete checkpoints older than the `keep_last` newest with id <= saved_id."""
    older = [info for info in list_checkpoints(save_dir) if info.rollout_id < saved_id]
    doomed = older[: max(0, len(older) - (keep_last - 1))]
    for info in doomed:
        remove_tree(info.path)

"""The start-of-run disk estimate: what the run's checkpoint saves will take (one checkpoint's bytes x the saves
kept on disk: ``keep_last``, else every save of the run) against the free space of the save dir; a warning
naming ``keep_last`` when it does not fit (issue 30: keep_last unset by default, so checkpoints grow without
bound).

One checkpoint = the fp32 main weights (4 bytes a parameter) + AdamW's two fp32 moments (8 bytes a parameter)
unless ``no_save_optim``; parameters counted from the model's safetensors headers (no tensor data read)."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from miles_core.checkpoint.validate import validate_hf_dir

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SaveBudget:
    checkpoint_bytes: int  # one checkpoint
    saves_kept: int  # checkpoints on disk at the end of the run
    free_bytes: int  # free space of the save dir (or its nearest existing parent) now

    @property
    def needed_bytes(self) -> int:
        return self.checkpoint_bytes * self.saves_kept


def _saves(num_rollout: int, save_interval: int | None) -> int:
    """Saves of a run: after every save_interval-th rollout and always after the last (config/checkpoint.py)."""
    return (num_rollout // save_interval if save_interval else 0) + 1


def save_budget(model_path: Path, save_dir: Path, num_rollout: int, checkpoint) -> SaveBudget:
    """The estimate for a run of ``num_rollout`` rollouts under the checkpoint config group ``checkpoint``."""
    params = validate_hf_dir(Path(model_path))["num_params"] or 0  # None: .bin weights, no header to count
    per_param = 4 if checkpoint.no_save_optim else 12
    saves = _saves(num_rollout, checkpoint.save_interval)
    kept = min(saves, checkpoint.keep_last) if checkpoint.keep_last else saves
    existing = next(p for p in (Path(save_dir), *Path(save_dir).parents) if p.exists())
    return SaveBudget(checkpoint_bytes=params * per_param, saves_kept=kept, free_bytes=shutil.disk_usage(existing).free)


def warn_if_saves_exceed_free_space(budget: SaveBudget, save_dir: Path) -> bool:
    """Log a warning naming keep_last when the saves cannot fit; -> whether it warned."""
    if budget.needed_bytes <= budget.free_bytes:
        return False
    logger.warning("%d checkpoint saves of ~%d bytes each (%d bytes) will not fit in the %d bytes free under %s: set "
                   "keep_last (e.g. --keep-last 2) or a save dir with more space", budget.saves_kept,
                   budget.checkpoint_bytes, budget.needed_bytes, budget.free_bytes, save_dir)
    return True

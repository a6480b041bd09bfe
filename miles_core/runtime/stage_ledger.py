"""The stage ledger: which post-save stages (eval, export) of each rollout completed, in
``<run_dir>/stages.json`` (rewritten atomically after each).

The save of rollout i runs before its weight sync, eval and export; a kill in between would lose them,
since a resume starts at rollout i + 1. The train flow marks each of them here once complete, and a
resume from checkpoint i first runs those due at i and not marked. Entries after the checkpoint a run
resumes from are forgotten: that run recomputes those rollouts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


class StageLedger:
    FILE = "stages.json"

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / self.FILE
        self._done: dict[str, list[str]] = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def done(self, rollout_id: int, stage: str) -> bool:
        return stage in self._done.get(str(rollout_id), [])

    def mark(self, rollout_id: int, stage: str) -> None:
        self._done.setdefault(str(rollout_id), []).append(stage)
        self._write()

    def forget_after(self, rollout_id: int) -> None:
        """Drop the entries of rollouts after ``rollout_id`` (-1: all of them, a fresh start)."""
        kept = {k: v for k, v in self._done.items() if int(k) <= rollout_id}
        if kept != self._done:
            self._done = kept
            self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(self._done, sort_keys=True))
        tmp.replace(self.path)

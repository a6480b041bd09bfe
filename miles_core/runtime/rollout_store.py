"""Rollout files: ``<run_dir>/rollouts/<rollout_id>.pt``, written atomically before training on them.

A file holds plain data only (lists, numbers, strings, dicts: samples as ``Sample.to_dict``, the metrics,
the weight version it was generated at, the data cursor after it), saved with ``torch.save`` and read
with ``weights_only=True``: loading a rollout file from elsewhere never runs code (a pickled object other
than those plain types fails to load, naming the file).

Retention: after each checkpoint, files a resume can still need (ids after that checkpoint's rollout)
and the newest ``keep_rollouts`` stay; older ones are deleted (their samples are in the MLflow sample
tables when ``log_samples`` is on).
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from pathlib import Path

import torch

from miles_core.checkpoint._fs import naming_full_disk
from miles_core.data import Sample

FORMAT = 1


@dataclass(frozen=True)
class RolloutFile:
    """The content of one rollout file."""

    samples: list[Sample]
    metrics: dict[str, float]
    weight_version: int
    cursor_after: dict


class RolloutStore:
    def __init__(self, root: Path, keep: int):
        self.root, self.keep = Path(root), keep

    def path(self, rollout_id: int) -> Path:
        return self.root / f"{rollout_id}.pt"

    def exists(self, rollout_id: int) -> bool:
        return self.path(rollout_id).exists()

    def write(self, rollout_id: int, data: RolloutFile) -> None:
        path = self.path(rollout_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        buf = io.BytesIO()  # serialized first: a full disk is reported with the bytes the file needs
        torch.save({"format": FORMAT, "samples": [s.to_dict() for s in data.samples], "metrics": data.metrics,
                    "weight_version": data.weight_version, "cursor_after": data.cursor_after}, buf)
        try:
            with naming_full_disk(path, buf.getbuffer().nbytes):
                tmp.write_bytes(buf.getbuffer())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        tmp.replace(path)

    def read(self, rollout_id: int) -> RolloutFile:
        path = self.path(rollout_id)
        try:
            saved = torch.load(path, weights_only=True)
        except pickle.UnpicklingError as e:
            raise ValueError(f"{path}: not a miles rollout file of plain data (it would run code to load, so it is not "
                             f"loaded: {type(e).__name__}); miles writes rollouts as plain tensors and lists: delete "
                             "this file and rerun to regenerate it from the checkpoint, and do not load it elsewhere "
                             "unless you trust where it came from") from None
        if not isinstance(saved, dict) or saved.get("format") != FORMAT:
            raise ValueError(f"{path}: not a miles rollout file (format {FORMAT})")
        return RolloutFile(samples=[Sample.from_dict(d) for d in saved["samples"]], metrics=saved["metrics"],
                           weight_version=saved["weight_version"], cursor_after=saved["cursor_after"])

    def prune(self, checkpoint_rollout: int) -> list[int]:
        """Delete files older than the newest ``keep`` that no resume from ``checkpoint_rollout`` reads. -> deleted ids."""
        ids = sorted(int(p.stem) for p in self.root.glob("*.pt") if p.stem.isdigit())
        kept = set(ids[-self.keep :]) | {i for i in ids if i > checkpoint_rollout}
        doomed = [i for i in ids if i not in kept]
        for i in doomed:
            self.path(i).unlink(missing_ok=True)
        return doomed

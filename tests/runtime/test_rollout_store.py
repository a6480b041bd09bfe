"""Rollout files: plain data that loads without running code, and retention after each checkpoint."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest
import torch

from miles_core.data import Sample
from miles_core.runtime.rollout_store import RolloutFile, RolloutStore

ROOT = Path(__file__).resolve().parents[2]


def _file(i: int) -> RolloutFile:
    s = Sample(group_index=i, tokens=[1, 2, 3], response_length=1, loss_mask=[1], rollout_log_probs=[-0.5],
               weight_versions=[i], reward={"score": 1.0}, metadata={"k": [1, "a"]}, label="3")
    return RolloutFile(samples=[s], metrics={"rollout/raw_reward": 1.0}, weight_version=i, cursor_after={"epoch": 0, "buffer": []})


def test_round_trip_of_plain_data(tmp_path):
    store = RolloutStore(tmp_path, keep=2)
    store.write(3, _file(3))
    got = store.read(3)
    assert got.samples[0].to_dict() == _file(3).samples[0].to_dict() and got.weight_version == 3
    assert got.metrics == {"rollout/raw_reward": 1.0} and got.cursor_after == {"epoch": 0, "buffer": []}


class _Payload:
    def __reduce__(self):  # what a malicious file would run on load
        return (print, ("pwned",))


def test_a_file_that_would_run_code_is_refused(tmp_path):
    store = RolloutStore(tmp_path, keep=2)
    torch.save({"format": 1, "samples": [], "metrics": {}, "weight_version": 0, "cursor_after": _Payload()}, store.path(0))
    with pytest.raises(ValueError, match=r"0\.pt: not a miles rollout file of plain data") as err:
        store.read(0)
    assert "delete this file and rerun" in str(err.value) and "weights_only=False" not in str(err.value)  # our advice, not torch's
    with store.path(1).open("wb") as f:
        pickle.dump({"format": 1}, f)  # a plain pickle, not a torch file
    with pytest.raises(Exception, match="1.pt"):
        store.read(1)


def test_retention_keeps_what_a_resume_needs_and_the_newest(tmp_path):
    store = RolloutStore(tmp_path, keep=2)
    for i in range(7):
        store.write(i, _file(i))
    assert store.prune(checkpoint_rollout=3) == [0, 1, 2, 3]  # 4..6 come after the checkpoint; 5, 6 are the newest
    assert sorted(int(p.stem) for p in tmp_path.glob("*.pt")) == [4, 5, 6]
    assert store.prune(checkpoint_rollout=6) == [4]


def test_every_torch_load_in_the_library_is_weights_only():
    """Checkpoints, optimizer states, RNG and rollout files: no load path unpickles arbitrary objects."""
    for path in (ROOT / "miles_core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "load" and getattr(node.func.value, "id", None) == "torch":
                kw = {k.arg: k.value for k in node.keywords}
                assert "weights_only" in kw and getattr(kw["weights_only"], "value", None) is True, f"{path}:{node.lineno}"

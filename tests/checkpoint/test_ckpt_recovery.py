"""Half-written and failed checkpoints: skipped with a warning naming the dir; failures leave no trace."""

from __future__ import annotations

import errno
import logging
import os
import shutil

import pytest
import torch

from miles_core.checkpoint import (
    CheckpointError,
    CheckpointInfo,
    find_latest,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from miles_core.checkpoint import _tensors


@pytest.fixture
def two_checkpoints(tmp_path, make_model):
    """<tmp>/ck with complete checkpoints 1 and 2 (latest -> 2) of one model + AdamW."""
    model = make_model()
    opt = torch.optim.AdamW(model.parameters())
    for rid in (1, 2):
        save_checkpoint(tmp_path / "ck", rid, model=model, optimizer=opt, state={"i": rid})
    return tmp_path / "ck"


def _no_marker(d):
    (d / ".complete").unlink()


def _no_model_file(d):
    (d / "model/model.safetensors").unlink()


def _truncated_optimizer(d):
    f = d / "optimizer.pt"
    os.truncate(f, f.stat().st_size // 2)


def _corrupt_meta(d):  # same size, so the manifest check passes and the meta check fires
    text = (d / "meta.json").read_text()
    (d / "meta.json").write_text("x" + text[1:])


def _wrong_id_in_meta(d):
    text = (d / "meta.json").read_text()
    (d / "meta.json").write_text(text.replace('"rollout_id": 2', '"rollout_id": 9'))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_no_marker, "no .complete marker"),
        (_no_model_file, "missing file model/model.safetensors"),
        (_truncated_optimizer, "truncated"),
        (_corrupt_meta, "unreadable meta.json"),
        (_wrong_id_in_meta, "rollout_id=9"),
    ],
)
def test_damaged_final_dir_is_skipped_and_named(two_checkpoints, caplog, damage, reason):
    damage(two_checkpoints / "2")
    with caplog.at_level(logging.WARNING):
        latest = find_latest(two_checkpoints)
    assert latest.rollout_id == 1 and latest.meta["i"] == 1
    assert f"skipping checkpoint dir {two_checkpoints / '2'}: " in caplog.text and reason in caplog.text
    assert "latest names '2', which is not a complete checkpoint" in caplog.text
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        load_checkpoint(CheckpointInfo(two_checkpoints / "2", 2, {}), model=torch.nn.Linear(1, 1))


def test_temp_dir_left_by_killed_save_is_skipped_and_named(two_checkpoints, caplog):
    leftover = two_checkpoints / ".tmp-3-4242"
    shutil.copytree(two_checkpoints / "2", leftover)  # a copy that even has a marker: still a temp dir
    with caplog.at_level(logging.WARNING):
        assert [i.rollout_id for i in list_checkpoints(two_checkpoints)] == [1, 2]
    assert str(leftover) in caplog.text and "temporary dir" in caplog.text
    assert find_latest(two_checkpoints).rollout_id == 2


def test_missing_or_garbage_pointer_falls_back_to_newest(two_checkpoints, caplog):
    (two_checkpoints / "latest").write_text("banana")
    with caplog.at_level(logging.WARNING):
        assert find_latest(two_checkpoints).rollout_id == 2
    assert "'banana'" in caplog.text
    (two_checkpoints / "latest").unlink()
    assert find_latest(two_checkpoints).rollout_id == 2
    assert "latest is missing" in caplog.text


def test_pointer_behind_newest_is_followed(two_checkpoints):
    # A save of 2 that died after the rename but before the pointer moved: resume from 1.
    (two_checkpoints / "latest").write_text("1\n")
    assert find_latest(two_checkpoints).rollout_id == 1


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _partial_safetensors_write(real):
    """save_file that writes the first file fine, then half a file and fails (disk full)."""
    calls = []

    def save_file(tensors, path, metadata=None):
        calls.append(path)
        if len(calls) == 1:
            return real(tensors, path, metadata=metadata)
        with open(path, "wb") as f:
            f.write(b"\0" * 100)
        _enospc()

    return save_file


@pytest.mark.parametrize("where", ["torch.save", "safetensors"])
@pytest.mark.parametrize("rollout_id", [3, 2], ids=["new-id", "resave-latest"])
def test_disk_full_mid_save_leaves_previous_state(two_checkpoints, make_model, monkeypatch, where, rollout_id):
    before = {p.relative_to(two_checkpoints): p.read_bytes() for p in two_checkpoints.rglob("*") if p.is_file()}
    if where == "torch.save":
        monkeypatch.setattr(torch, "save", _enospc)  # optimizer.pt, after the model file
    else:
        monkeypatch.setattr(_tensors, "save_file", _partial_safetensors_write(_tensors.save_file))
    model = make_model(seed=7)
    with pytest.raises(OSError) as excinfo:
        save_checkpoint(
            two_checkpoints, rollout_id, model=model, optimizer=torch.optim.AdamW(model.parameters()),
            state={}, keep_last=1, extra_tensors={"critic": torch.nn.Linear(2, 1)},
        )  # fmt: skip
    assert excinfo.value.errno == errno.ENOSPC
    monkeypatch.undo()

    after = {p.relative_to(two_checkpoints): p.read_bytes() for p in two_checkpoints.rglob("*") if p.is_file()}
    assert after == before  # every byte, `latest` included; no temp dir, nothing deleted by retention
    assert sorted(p.name for p in two_checkpoints.iterdir()) == ["1", "2", "latest"]
    latest = find_latest(two_checkpoints)
    assert latest.rollout_id == 2
    resumed = make_model(seed=8)
    load_checkpoint(latest, model=resumed, optimizer=torch.optim.AdamW(resumed.parameters()))


def test_failed_publish_in_two_rename_swap_restores_old_dir(two_checkpoints, make_model, monkeypatch):
    """Without renameat2 a re-save moves the old dir aside first; if the new one cannot be renamed
    in, the old one goes back under its name."""
    from miles_core.checkpoint import _fs

    real_rename = os.rename

    def rename(src, dst):
        if os.path.basename(src).startswith(".tmp-2-"):
            raise OSError(errno.EIO, "I/O error")
        real_rename(src, dst)

    monkeypatch.setattr(_fs, "_exchange", lambda src, dst: False)
    monkeypatch.setattr(_fs.os, "rename", rename)
    with pytest.raises(OSError):
        save_checkpoint(two_checkpoints, 2, model=make_model(seed=3), state={"i": "new"})
    monkeypatch.undo()
    assert sorted(p.name for p in two_checkpoints.iterdir()) == ["1", "2", "latest"]
    assert find_latest(two_checkpoints).meta["i"] == 2


def test_same_size_corruption_of_newest_is_caught_by_checksum(two_checkpoints, caplog, make_model):
    """A flipped byte inside the model file keeps its size (the listing still counts it complete); the
    SHA-256 in the manifest catches it at load: the resume falls back to checkpoint 1, naming the file."""
    f = two_checkpoints / "2" / "model" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    assert [i.rollout_id for i in list_checkpoints(two_checkpoints)] == [1, 2]  # sizes only: still listed
    with caplog.at_level(logging.WARNING):
        latest = find_latest(two_checkpoints)
    assert latest.rollout_id == 1 and latest.verified
    assert f"skipping checkpoint {two_checkpoints / '2'}: {f} does not match its SHA-256" in caplog.text
    with pytest.raises(CheckpointError, match="does not match its SHA-256"):
        load_checkpoint(CheckpointInfo(two_checkpoints / "2", 2, {}), model=make_model())

"""preflight (miles_core/preflight.py) and the run dir lock (miles_core/runlock.py): real files, real flock."""

from __future__ import annotations

import os
import shutil
import socket

import pytest

from miles_core import runlock
from miles_core.assemble import build_config
from miles_core.preflight import PreflightError, check_writable_dir, preflight

BASE = {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "prompt_data": "builtin://arith"}


def _cfg(tmp_path, **values):
    return build_config({**BASE, "run_dir": str(tmp_path / "run"), **values})


def test_a_good_config_passes_and_creates_its_dirs(tmp_path):
    cfg = _cfg(tmp_path)
    preflight(cfg)
    assert cfg.run_dir.is_dir() and cfg.save_dir.is_dir() and cfg.export_dir.is_dir()
    assert not any(p.name.startswith(".miles-preflight") for p in cfg.run_dir.iterdir())


@pytest.mark.parametrize(("values", "message"), [
    ({"hf_checkpoint": "/nonexistent/model"}, "hf_checkpoint /nonexistent/model: no such directory"),
    ({"eval_config": "/nonexistent/eval.yaml"}, "eval_config /nonexistent/eval.yaml: no such file"),
    ({"save": "/proc/miles-save"}, "save /proc/miles-save: not writable"),
])
def test_bad_paths_are_named(tmp_path, values, message):
    with pytest.raises(PreflightError, match=message):
        preflight(_cfg(tmp_path, **values))


def test_a_load_dir_without_checkpoints_is_refused(tmp_path):
    (tmp_path / "old").mkdir()
    with pytest.raises(PreflightError, match="no checkpoint in it"):
        preflight(_cfg(tmp_path, load=str(tmp_path / "old")))
    (tmp_path / "old" / "3").mkdir()
    preflight(_cfg(tmp_path, load=str(tmp_path / "old")))


def test_too_little_free_space_is_refused_naming_the_dir(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    check_writable_dir("save", tmp_path / "s", need=1)
    with pytest.raises(PreflightError, match=r"save .*/s: \d+ MiB free, a run needs at least"):
        check_writable_dir("save", tmp_path / "s", need=free + 2**40)


def test_the_lock_refuses_a_second_holder_until_released(tmp_path):
    cfg = _cfg(tmp_path)
    lock = runlock.hold(cfg)
    with pytest.raises(runlock.RunDirBusy, match=f"pid {os.getpid()} on host {socket.gethostname()}"):
        runlock.hold(cfg)
    with pytest.raises(runlock.RunDirBusy):
        runlock.probe(_cfg(tmp_path, save=str(cfg.save_dir)))  # the same save dir from another run dir's view
    lock.release()
    runlock.probe(cfg)
    runlock.hold(cfg).release()

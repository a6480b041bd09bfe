"""The start-of-run estimate of checkpoint bytes vs free space (issue 30, finding 7)."""

from __future__ import annotations

import logging
import shutil

from miles_core.checkpoint.budget import SaveBudget, save_budget, warn_if_saves_exceed_free_space
from miles_core.checkpoint.validate import validate_hf_dir
from flows.recipes import load_config


def test_the_estimate_counts_fp32_weights_and_adam_moments_times_the_saves_kept(tmp_path, tiny_model_dir):
    params = validate_hf_dir(tiny_model_dir)["num_params"]
    cfg = load_config("tiny", {"run_dir": str(tmp_path), "save_interval": 3})
    b = save_budget(tiny_model_dir, cfg.save_dir, 30, cfg.checkpoint)
    assert (b.checkpoint_bytes, b.saves_kept) == (12 * params, 11)  # after rollouts 2, 5, ..., 29: 10 saves, + the last
    assert 0 < b.free_bytes <= shutil.disk_usage(tmp_path).total
    kept = load_config("tiny", {"run_dir": str(tmp_path), "save_interval": 3, "keep_last": 2, "no_save_optim": True})
    assert save_budget(tiny_model_dir, kept.save_dir, 30, kept.checkpoint).needed_bytes == 2 * 4 * params


def test_saves_that_cannot_fit_warn_naming_keep_last(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="miles_core.checkpoint.budget"):
        assert warn_if_saves_exceed_free_space(SaveBudget(checkpoint_bytes=35_000_000, saves_kept=30, free_bytes=400_000_000), tmp_path)
        assert not warn_if_saves_exceed_free_space(SaveBudget(checkpoint_bytes=35_000_000, saves_kept=2, free_bytes=400_000_000), tmp_path)
    (record,) = caplog.records
    assert "30 checkpoint saves of ~35000000 bytes each (1050000000 bytes)" in record.getMessage()
    assert "keep_last" in record.getMessage() and str(tmp_path) in record.getMessage()

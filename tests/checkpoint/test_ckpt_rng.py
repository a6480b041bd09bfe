"""capture_rng_state / restore_rng_state: draws after a restore repeat the draws after the capture."""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
import torch

from miles_core.checkpoint import CheckpointError, capture_rng_state, restore_rng_state


def _draw() -> tuple:
    return random.random(), np.random.rand(3).tolist(), np.random.randn(), torch.rand(3), torch.randint(0, 9, (4,))


def _assert_same(a: tuple, b: tuple) -> None:
    assert a[:3] == b[:3]
    assert torch.equal(a[3], b[3]) and torch.equal(a[4], b[4])


def test_restore_repeats_draws_in_memory():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    np.random.randn()  # leaves a cached gaussian in numpy's state: it must be captured too
    state = capture_rng_state()
    first = _draw()
    _draw()  # move on
    restore_rng_state(state)
    _assert_same(_draw(), first)


def test_state_survives_torch_save_weights_only(tmp_path):
    state = capture_rng_state()
    first = _draw()
    torch.save(state, tmp_path / "rng.pt")
    restore_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    _assert_same(_draw(), first)


def test_missing_key_is_named():
    state = capture_rng_state()
    del state["numpy"]
    with pytest.raises(CheckpointError, match="numpy"):
        restore_rng_state(state)


def test_cuda_state_without_cuda_warns(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    state = {**capture_rng_state(), "torch_cuda": [torch.get_rng_state()]}
    with caplog.at_level(logging.WARNING):
        restore_rng_state(state)
    assert "CUDA RNG not restored" in caplog.text

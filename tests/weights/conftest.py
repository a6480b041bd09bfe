"""Shared by the weight-sync tests: one torch thread per module (engines and senders share 2 CPUs), and the 'trainer':
the tiny checkpoint moved away from what the engines loaded."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """tests/conftest.py's one_torch_thread for every module here."""


@pytest.fixture
def trainer_model(moved_tiny_model):
    return moved_tiny_model()

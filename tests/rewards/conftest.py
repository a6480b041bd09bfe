"""Shared fixtures for the reward tests.

The helper module ``reward_fns`` (custom reward functions addressed by dotted path) sits next
to the tests; its directory is put on ``sys.path`` so that ``load_function`` can import it
under any pytest import mode.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture(scope="session")
def warm_sympy():
    """The default sympy pool with every worker started (startup is not what tests time)."""
    from miles_core.rewards.sympy_pool import default_pool

    pool = default_pool()
    pool.warm()
    return pool

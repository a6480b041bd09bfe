"""miles_core/env.py: the variables miles reads are parsed strictly; a bad value stops the CLI with one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from miles_core.env import allow_hub

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text, allowed", [("", False), ("0", False), ("1", True)])
def test_allow_hub_values(text, allowed):
    assert allow_hub(text) is allowed


@pytest.mark.parametrize("text", ["true", "yes", "2"])
def test_allow_hub_refuses_what_it_would_ignore(text):
    """Before, any value but 1 left the hub offline without a word (MILES_ALLOW_HUB=true did nothing)."""
    with pytest.raises(ValueError, match=f"MILES_ALLOW_HUB='{text}': expected 1"):
        allow_hub(text)


def test_a_bad_value_stops_the_cli_with_one_line(tmp_path):
    env = {**os.environ, "MILES_ALLOW_HUB": "true", "PYTHONPATH": str(ROOT), "MILES_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-c", "import flows"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "error: MILES_ALLOW_HUB='true': expected 1 (download from the hub) or 0 (offline, the default)"

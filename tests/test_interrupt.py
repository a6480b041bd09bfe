"""flows/interrupt.py: a signal under ``deferred_signals`` is recorded, not raised where the main thread happens to be;
the flow raises it at its next stage boundary; a second signal exits at once. Real signals to a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flows.interrupt import Interrupted, deferred_signals, signal_name, stop_if_interrupted

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_is_raised_at_the_next_stage_boundary_naming_it(sig):
    with deferred_signals():
        stop_if_interrupted()  # nothing yet
        os.kill(os.getpid(), sig)  # delivered here, in the main thread: recorded, nothing raised
        with pytest.raises(Interrupted) as got:
            stop_if_interrupted()
    assert signal_name(got.value) == sig.name and isinstance(got.value, KeyboardInterrupt)
    stop_if_interrupted()  # outside: forgotten


def test_a_second_sigint_exits_at_once_with_130():
    code = ("import os, signal, time\nfrom flows.interrupt import deferred_signals\nwith deferred_signals():\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n    print('recorded', flush=True)\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(30)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 130 and proc.stdout.strip() == "recorded", (proc.stdout, proc.stderr)
    assert "second interrupt: exiting now" in proc.stderr

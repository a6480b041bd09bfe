"""A full disk names what was being written and the bytes it needed (issue 30 #7), on a real full filesystem: a
512 KiB tmpfs mounted in a private mount namespace (``unshare -m``: the mount exists for that one process and goes
with it; nothing is written outside the test's dir). Three writers, three ways a full disk is reported: safetensors
(the model file: "No space left on device (os error 28)"), torch.save (the optimizer: PyTorch's "file write failed",
no errno) and a plain write (a rollout file: OSError ENOSPC)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = r"""
import json, sys, torch
from pathlib import Path
from miles_core.checkpoint import DiskFull, list_checkpoints, save_checkpoint
from miles_core.data import Sample
from miles_core.runtime.rollout_store import RolloutFile, RolloutStore

full = Path(sys.argv[1])
out = {}

def attempt(name, fn):
    try:
        fn()
        out[name] = None
    except DiskFull as e:
        out[name] = {"message": str(e), "filename": e.filename, "needed": e.needed_bytes, "free": e.free_bytes}

big = torch.nn.Linear(512, 512)  # 1 MiB of fp32 weights: the model file does not fit
attempt("model", lambda: save_checkpoint(full / "a", 0, model=big, state={}))
small = torch.nn.Linear(256, 256)  # 257 KiB fits; AdamW's two moments (514 KiB) do not
opt = torch.optim.AdamW(small.parameters())
small(torch.ones(1, 256)).sum().backward()
opt.step()
attempt("optimizer", lambda: save_checkpoint(full / "b", 0, model=small, optimizer=opt, state={}))
samples = [Sample(tokens=list(range(4000)), response_length=10, reward=1.0) for _ in range(64)]
attempt("rollout", lambda: RolloutStore(full / "rollouts", keep=2).write(0, RolloutFile(samples=samples, metrics={},
                                                                                        weight_version=1, cursor_after={})))
out["left"] = sorted(str(p.relative_to(full)) for p in full.rglob("*") if p.is_file())
out["checkpoints"] = [str(i.path) for i in list_checkpoints(full / "b")]
print(json.dumps(out))
"""


def test_a_full_disk_names_the_path_and_the_bytes_it_needed(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    script = tmp_path / "fill.py"
    script.write_text(SCRIPT)
    cmd = f"mount -t tmpfs -o size=512k tmpfs {full} && exec {sys.executable} {script} {full}"
    proc = subprocess.run(["unshare", "-m", "sh", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, target, at_least in [("model", full / "a" / "0", 512 * 512 * 4), ("optimizer", full / "b" / "0", 3 * 257 * 256 * 4),
                                   ("rollout", full / "rollouts" / "0.pt", 64 * 4000)]:
        e = got[name]
        assert e is not None, f"the {name} write did not fail on a 512 KiB filesystem"
        assert e["filename"] == str(target) and str(target) in e["message"], e
        assert e["needed"] >= at_least and f"{e['needed']:,} bytes" in e["message"], e
        assert e["free"] is not None and e["free"] < e["needed"], e
    assert got["left"] == [] and got["checkpoints"] == []  # every partial write removed: nothing half-written is left

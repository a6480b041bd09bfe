"""miles_core/malloc.py: after retain_freed_memory() a step's large tensors reuse freed memory instead of fresh pages
(counted as the kernel's minor page faults); glibc's own settings in the environment win. Each case runs in a fresh
process (mallopt changes a process for good). The CPU runtime calling it: tests/runtime/test_runtime_contract.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json, resource, torch
    from miles_core.malloc import retain_freed_memory
    retained = retain_freed_memory()
    def step():  # the shape of a train step's temporaries: activations, a 100 MB [512, 49152] logits block
        xs = [torch.empty(512, 576).fill_(1.0) for _ in range(40)] + [torch.empty(512, 49152).fill_(1.0)]
        del xs
    step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        step()
    print(json.dumps({"retained": retained, "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5}))
""")

def _child(**env) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", CHILD], env={**clean, **env}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_freed_memory_is_reused_instead_of_fresh_pages_and_the_users_glibc_setting_wins():
    kept = _child()
    default = _child(MALLOC_TRIM_THRESHOLD_="131072")  # glibc's default, set by the user: left alone
    assert kept["retained"] is True and default["retained"] is False
    # 100 MB + 40 x 1.2 MB touched per step: ~36,000 fresh 4 KiB pages with glibc's thresholds
    assert default["faults"] > 20_000
    assert kept["faults"] < default["faults"] / 4

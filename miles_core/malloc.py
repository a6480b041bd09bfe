"""glibc's allocator told to keep freed memory for the next step's tensors, in a process that trains or samples on the CPU.

A CPU step allocates the same large tensors every time (activations, logits over the vocabulary, their gradients).
With glibc's defaults each of them is fresh memory: an allocation over its mmap threshold (dynamic, 128 KiB to 32 MiB)
is a new mapping, and memory freed at the heap's top is handed back to the kernel (trim threshold 128 KiB, also
dynamic). Either way the kernel zero-fills every 4 KiB page again on first touch. Measured on the SmolLM2-135M
4x4x32 train step: ~220,000 minor page faults (0.9 GB) per step, none after ``retain_freed_memory()``
(docs/performance.md, "What makes a step cheaper"). The price: the process keeps its peak heap instead of
returning it between steps.

``retain_freed_memory()`` sets both thresholds by ``mallopt`` (glibc's documented M_MMAP_THRESHOLD = -3 and
M_TRIM_THRESHOLD = -1, malloc.h) for the calling process, once. It does nothing off glibc (musl, macOS) and leaves
glibc's own settings alone where the user gave them: ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` in the
environment (glibc reads them at start: setting either is how a user chooses the thresholds instead).
Called where a process puts its trainer or engine on the CPU: the local runtime, each Ray train rank, the HTTP
engine server.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from functools import lru_cache

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc malloc.h
MMAP_THRESHOLD = 1 << 30  # allocations up to 1 GiB come from the heap (the SmolLM2 step's logits are 100 MB)
TRIM_THRESHOLD = (1 << 31) - 1  # mallopt takes an int: the heap is never trimmed below 2 GiB of free top
MMAP_ENV = "MALLOC_MMAP_THRESHOLD_"  # glibc's own settings (bytes): where the user set one, theirs stand
TRIM_ENV = "MALLOC_TRIM_THRESHOLD_"


@lru_cache(maxsize=1)
def retain_freed_memory() -> bool:
    """Once per process: True when glibc now keeps freed memory, False where it was left as it was."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or os.environ.get(MMAP_ENV) or os.environ.get(TRIM_ENV):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))

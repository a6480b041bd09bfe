"""The one error type of `miles_core.checkpoint`.

`CheckpointError` is a `ValueError`: it means "this directory / these inputs are not what a
checkpoint or HF snapshot should be". Its message always names the file (or directory) and the
missing or bad field, so a log line is enough to find the problem. I/O errors (`OSError`) propagate unchanged after
the temporary directory is removed, except a full disk: `DiskFull` (an OSError, errno ENOSPC; _fs.py) names the
checkpoint or export being written and the bytes it needed, whichever serializer hit it.
"""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint, an HF export or a save/load request is malformed; the message names the file."""

"""Durable, atomic filesystem primitives shared by checkpoints and HF exports.

Guarantees (POSIX, single writer per directory):

- `write_marker(d)` fsyncs every file under `d`, then writes `d/.complete` (a JSON manifest of
  every file's relative path, byte size and SHA-256) and fsyncs it and every directory under `d`. It
  is the last write into `d`; a directory is complete only if its marker exists and every listed file
  exists with the listed size (`marker_problem`, cheap: every listing runs it); `checksum_problem`
  also re-hashes every file (what a load runs: a same-size corruption is caught there).
- `replace_dir(src, dst)` publishes `src` under the name `dst`. A fresh name is one `rename(2)`.
  An existing `dst` is swapped in one step with `renameat2(RENAME_EXCHANGE)` where the kernel and
  filesystem support it; otherwise it is moved aside to `.trash-<name>-<pid>` and `src` renamed in
  (two renames: a crash between them leaves the old content under the trash name, which readers
  report and skip). The parent directory is fsynced after the rename.
- `atomic_write_text(path, text)` writes `path` through a sibling temp file and `os.replace`.
- `naming_full_disk(path, needed)` turns a full disk inside it (ENOSPC, or the serializers' own error for it) into
  `DiskFull`: an OSError(ENOSPC) naming the file or dir written, the bytes it needed and the bytes free there.
- `remove_tree(d)` renames `d` to a `.trash-` name first (so a crash mid-delete never leaves a
  half-deleted directory under a readable name), then deletes it.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import logging
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

logger = logging.getLogger(__name__)

MARKER = ".complete"
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_EXCHANGE_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EXDEV}


def fsync_path(path: Path) -> None:
    """fsync a file or a directory by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DiskFull(OSError):
    """No space left on device while writing ``path``, which needed about ``needed_bytes``; ``free_bytes`` free there."""

    def __init__(self, path: Path, needed_bytes: int, free_bytes: int | None):
        free = "unknown" if free_bytes is None else f"{free_bytes:,}"
        super().__init__(errno.ENOSPC, f"no space left on device writing {path}: it needs about {needed_bytes:,} bytes, "
                                       f"{free} bytes are free there", str(path))
        self.needed_bytes, self.free_bytes = needed_bytes, free_bytes

    def __str__(self) -> str:
        return self.strerror


def _free_bytes(path: Path) -> int | None:
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    try:
        return shutil.disk_usage(existing).free if existing is not None else None
    except OSError:
        return None


def is_disk_full(e: BaseException, path: Path | None = None, needed_bytes: int = 0) -> bool:
    """ENOSPC as the OS or safetensors ("No space left on device (os error 28)") report it, or any failed write while
    less than ``needed_bytes`` is free under ``path``: torch.save names no errno ("unexpected pos 1472 vs 1364")."""
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return True
    if "No space left on device" in str(e) or "os error 28" in str(e):
        return True
    free = _free_bytes(path) if path is not None else None
    return free is not None and free < needed_bytes


@contextmanager
def naming_full_disk(path: Path, needed_bytes: int) -> Iterator[None]:
    """A full disk inside -> DiskFull naming ``path`` and ``needed_bytes``; any other error passes unchanged."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as e:
        if not is_disk_full(e, Path(path), needed_bytes):
            raise
        raise DiskFull(Path(path), needed_bytes, _free_bytes(Path(path))) from e


def tensor_bytes(obj) -> int:
    """Bytes of the tensors in ``obj`` (nested dicts, lists, tuples): the payload a save of it writes."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def write_bytes_durable(path: Path, data: bytes) -> None:
    """Write `data` to `path` (not atomically) and fsync it."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_text(path: Path, text: str) -> None:
    """Replace `path` with `text` atomically: temp sibling, fsync, os.replace, fsync parent."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}-{os.getpid()}")
    try:
        write_bytes_durable(tmp, text.encode())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_marker(directory: Path, extra: dict | None = None) -> dict[str, int]:
    """fsync everything under `directory`, then write its `.complete` manifest last.

    Returns `{relative path: size in bytes}`; the manifest also holds each file's SHA-256.
    """
    files: dict[str, int] = {}
    digests: dict[str, str] = {}
    subdirs = [directory]
    for root, dirnames, filenames in os.walk(directory):
        subdirs.extend(Path(root) / d for d in dirnames)
        for name in filenames:
            path = Path(root) / name
            rel = path.relative_to(directory).as_posix()
            if rel == MARKER:
                continue
            fsync_path(path)
            files[rel] = path.stat().st_size
            digests[rel] = sha256_file(path)
    body = {**(extra or {}), "files": dict(sorted(files.items())), "sha256": dict(sorted(digests.items()))}
    write_bytes_durable(directory / MARKER, json.dumps(body, indent=1).encode())
    for d in subdirs:
        fsync_path(d)
    return files


def marker_problem(directory: Path) -> str | None:
    """Why `directory` is not complete, or None when its marker and manifest check out.

    An empty marker (written by another tool) counts as complete by presence alone.
    """
    marker = directory / MARKER
    if not marker.is_file():
        return f"no {MARKER} marker (interrupted write?)"
    raw = marker.read_bytes()
    if not raw.strip():
        return None
    try:
        files = json.loads(raw)["files"]
    except (ValueError, KeyError, TypeError) as e:
        return f"unreadable {MARKER} marker ({e})"
    for rel, size in files.items():
        path = directory / rel
        if not path.is_file():
            return f"missing file {rel} listed in {MARKER}"
        if path.stat().st_size != size:
            return f"{rel} has {path.stat().st_size} bytes, {MARKER} says {size} (truncated?)"
    return None


def checksum_problem(directory: Path) -> str | None:
    """`marker_problem`, then every file's SHA-256 against the manifest (markers without checksums, from
    before they were recorded, pass on sizes alone). -> why not, naming the file, or None."""
    problem = marker_problem(directory)
    if problem:
        return problem
    raw = (directory / MARKER).read_bytes()
    digests = json.loads(raw).get("sha256", {}) if raw.strip() else {}
    for rel, digest in digests.items():
        if sha256_file(directory / rel) != digest:
            return f"{directory / rel} does not match its SHA-256 in {MARKER} (corrupted)"
    return None


def _exchange(src: Path, dst: Path) -> bool:
    """Atomically swap two paths with renameat2(RENAME_EXCHANGE); False when unsupported."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    rc = renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in _EXCHANGE_UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), str(dst))


def replace_dir(src: Path, dst: Path) -> None:
    """Publish directory `src` as `dst` (see module docstring); the old `dst` is deleted."""
    if not dst.exists():
        os.rename(src, dst)
        fsync_path(dst.parent)
        return
    if _exchange(src, dst):
        fsync_path(dst.parent)
        remove_tree(src)  # now holds the old content
        return
    trash = dst.with_name(f"{TRASH_PREFIX}{dst.name}-{os.getpid()}")
    os.rename(dst, trash)
    try:
        os.rename(src, dst)
    except BaseException:
        os.rename(trash, dst)  # put the old one back before the caller removes src
        raise
    fsync_path(dst.parent)
    remove_tree(trash)


def remove_tree(directory: Path) -> None:
    """Delete `directory` (trash-rename first); leftovers are logged, never raised."""
    if not directory.exists():
        return
    target = directory
    if not directory.name.startswith((TMP_PREFIX, TRASH_PREFIX)):
        target = directory.with_name(f"{TRASH_PREFIX}{directory.name}-{os.getpid()}")
        shutil.rmtree(target, ignore_errors=True)
        os.rename(directory, target)
        fsync_path(directory.parent)
    shutil.rmtree(target, ignore_errors=True)
    if target.exists():
        logger.warning("could not fully delete %s; it is skipped by readers, delete it by hand", target)

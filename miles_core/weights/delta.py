"""Disk-delta weight sync (update_weight_transfer_mode disk-delta): the trainer publishes the bytes that changed since
the last sync, each engine verifies and applies them into its local checkpoint and reloads from it.

The formats are the reference's (miles/backends/megatron_utils/update_weight/update_weight_from_distributed/delta.py,
miles/utils/disk_delta.py) and the engine side's that SGLang grew after 0.5.23 (python/sglang/srt/weight_sync/
local_checkpoint.py, behind its /pull_weights):

    <update_weight_disk_dir>/weight_v<NNNNNN>/     one dir per sync, a canonical HF checkpoint dir
        full version   model.safetensors (+ config.json) and model.safetensors.index.json whose metadata has no
                       delta_encoding: an engine pulling it copies it as it is (a new chain starts here)
        delta version  model-00000-of-00001.safetensors: per changed tensor a uint8 tensor of the zstd (level 1)
                       compressed diff, the file's __metadata__ {tensor name: checksum of its NEW bytes}; the index's
                       metadata {version, base_version, delta_encoding, compression_format: zstd, checksum_format}
    encodings (byte-level, dtype-blind, both exact)
        xor            new ^ old (an involution: applied once, on its base version)
        overwrite      u4 count, u4 positions, then the new bytes at them (idempotent)
    checksums          xxh3-128 (xxhash's hexdigest), adler32 (8 hex digits of zlib's)

Departures, on purpose: the first publication of a trainer process is a full version of its current weights (the
reference's newer seed, not its older "snapshot hf_checkpoint, publish nothing": a resumed run's trainer holds its
checkpoint's weights, not hf_checkpoint's), before which the trainer clears the dir of an earlier run's versions; every
index also carries ``stream`` (one id per publishing process), which the engine's applied-version marker records, so a
chain is never continued on a local checkpoint of another run; and an engine verifies every tensor of a delta before
it writes any byte, so a corrupt delta is refused and the local checkpoint (and the weights served) stay as they were
(SGLang patches in place and reseeds after a mismatch).

    DeltaPublisher   the trainer's side: snapshot of the last published bytes, publish(named, version) -> Published
    pull             the engine's side: bring a local checkpoint to a version (seed from a full one, apply deltas)
    DeltaError       a delta that cannot be applied (checksum mismatch, out of order, unknown format): nothing written
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import struct
import uuid
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

ENCODINGS = ("xor", "overwrite")
CHECKSUMS = ("xxh3-128", "adler32")
INDEX = "model.safetensors.index.json"
SYNC_DIR = ".weight_sync"  # in the local checkpoint: the applied-version marker and the pull lock (SGLang's name)
DELTA_FILE = "model-00000-of-00001.safetensors"  # one publishing rank: the reference's model-{offset:05d}-of-{total:05d}
ZSTD_LEVEL = 1  # the reference's: zstandard.ZstdCompressor(level=1)


class DeltaError(RuntimeError):
    """A published version this engine cannot apply; nothing of it was written."""


def version_dir(root: str | Path, version: int) -> Path:
    return Path(root) / f"weight_v{version:06d}"


# ---- bytes: checksum, compression, encodings ------------------------------------------------------------------------
def checksum(algorithm: str, buf) -> str:
    if algorithm == "xxh3-128":
        import xxhash

        return xxhash.xxh3_128(buf).hexdigest()
    if algorithm == "adler32":
        return f"{zlib.adler32(buf):08x}"
    raise DeltaError(f"checksum {algorithm!r} is not supported (expected one of {CHECKSUMS})")


def zstd_compress(data: np.ndarray) -> np.ndarray:
    import pyarrow as pa

    codec = pa.Codec("zstd", compression_level=ZSTD_LEVEL)
    return np.frombuffer(codec.compress(data.tobytes(), asbytes=True), np.uint8)


def zstd_content_size(frame: bytes) -> int:
    """The Frame_Content_Size of a zstd frame's header (RFC 8878 3.1.1.1): one-shot compressors write it."""
    if len(frame) < 6 or frame[:4] != b"\x28\xb5\x2f\xfd":
        raise DeltaError("not a zstd frame")
    fhd = frame[4]
    fcs_flag, single, dict_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
    size = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if size == 0:
        raise DeltaError("zstd frame without a content size")
    value = int.from_bytes(frame[pos:pos + size], "little")
    return value + 256 if size == 2 else value


def zstd_decompress(frame: bytes) -> np.ndarray:
    import pyarrow as pa

    out = pa.decompress(frame, decompressed_size=zstd_content_size(frame), codec="zstd", asbytes=True)
    return np.frombuffer(out, np.uint8)


def encode(new: np.ndarray, old: np.ndarray, encoding: str) -> tuple[np.ndarray | None, int]:
    """-> (the uncompressed delta of ``old`` -> ``new``, or None when nothing changed; the bytes changed)."""
    if encoding == "xor":
        diff = new ^ old
        changed = int(np.count_nonzero(diff))
    elif encoding == "overwrite":
        mask = new != old
        changed = int(np.count_nonzero(mask))
        if new.size > 2**32:
            raise ValueError(f"overwrite encodes u4 positions: a tensor of {new.size} bytes is too large; use xor")
        pos = np.flatnonzero(mask).astype("<u4")
        diff = np.concatenate([np.array([pos.size], "<u4").view(np.uint8), pos.view(np.uint8), new[mask]])
    else:
        raise ValueError(f"delta encoding {encoding!r}: expected one of {ENCODINGS}")
    return (diff if changed else None), changed


def decode(old: np.ndarray, delta: np.ndarray, encoding: str) -> np.ndarray:
    """The new bytes from the ``old`` ones and an uncompressed delta (a new array; ``old`` is not changed)."""
    if encoding == "xor":
        if delta.size != old.size:
            raise DeltaError(f"xor delta of {delta.size} bytes for a tensor of {old.size}")
        return old ^ delta
    if encoding == "overwrite":
        count = int(delta[:4].view("<u4")[0])
        pos = delta[4:4 + 4 * count].view("<u4")
        values = delta[4 + 4 * count:]
        if values.size != count or (count and int(pos.max()) >= old.size):
            raise DeltaError(f"overwrite delta does not fit a tensor of {old.size} bytes")
        new = old.copy()
        new[pos] = values
        return new
    raise DeltaError(f"delta encoding {encoding!r} is not supported (expected one of {ENCODINGS})")


def tensor_bytes(t: torch.Tensor) -> np.ndarray:
    """A copy of a tensor's bytes (its memory order, little-endian on every platform torch runs on), flat uint8."""
    return t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().copy()


# ---- the trainer's side -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Published:
    """One published version: its dir, whether it is a full one, the changed fraction of the bytes, the bytes written."""

    version_dir: str
    full: bool
    density: float
    wire_bytes: int

    def metrics(self) -> dict[str, float]:
        """The reference's (delta.py _record_metrics)."""
        return {"perf/update_weights_density": self.density, "perf/update_weights_wire_bytes": float(self.wire_bytes)}


class DeltaPublisher:
    """Publishes each sync under ``disk_dir``: the first of this object a full version, later ones deltas against the
    bytes it published last (its snapshot, a CPU copy of every tensor). Publishing a version again (a restarted
    engine's resync) publishes nothing and answers the same; with ``full`` it starts a new chain (the sync after one
    whose delta an engine refused: the engines never applied the bytes the snapshot holds)."""

    def __init__(self, disk_dir: str | Path, encoding: str = "xor", checksum_format: str = "xxh3-128"):
        if encoding not in ENCODINGS:
            raise ValueError(f"update_weight_delta_encoding {encoding!r}: expected one of {ENCODINGS}")
        if checksum_format not in CHECKSUMS:
            raise ValueError(f"update_weight_delta_checksum {checksum_format!r}: expected one of {CHECKSUMS}")
        self.disk_dir, self.encoding, self.checksum_format = Path(disk_dir), encoding, checksum_format
        self.stream = uuid.uuid4().hex
        self.snapshot: dict[str, np.ndarray] = {}
        self.last: tuple[int, Published] | None = None
        self.refused = False  # set by the in-process sync when the engine refused the last version (sync_delta)

    def publish(self, named: Iterable[tuple[str, torch.Tensor]], version: int, hf_config=None, full: bool = False) -> Published:
        """``full``: a full version even after the first (a new chain: after engines refused a delta)."""
        if not full and self.last is not None and self.last[0] == version:
            return self.last[1]
        named = list(named)
        arrays = {n: tensor_bytes(t) for n, t in named}
        if self.last is None:
            self._clear()
        full = full or self.last is None
        target = version_dir(self.disk_dir, version)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if full:
            published = self._write_full(tmp, named, version, hf_config)
        else:
            published = self._write_delta(tmp, arrays, version)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
        self.snapshot = arrays
        published = Published(version_dir=str(target), full=published.full, density=published.density,
                              wire_bytes=published.wire_bytes)
        self.last = (version, published)
        return published

    def _clear(self) -> None:
        """An earlier run's versions would chain onto the wrong base (the reference's baseline rmtree, delta.py)."""
        self.disk_dir.mkdir(parents=True, exist_ok=True)
        for old in list(self.disk_dir.glob("weight_v*")) + list(self.disk_dir.glob(".weight_v*")):
            shutil.rmtree(old, ignore_errors=True)

    def _meta(self, version: int) -> dict[str, str]:
        return {"version": f"{version:06d}", "stream": self.stream}

    def _write_full(self, tmp: Path, named: list[tuple[str, torch.Tensor]], version: int, hf_config) -> Published:
        from safetensors.torch import save_file

        tensors = {n: t.detach().to("cpu").contiguous().clone() for n, t in named}  # clones: tied weights share storage
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if hf_config is not None:
            hf_config.save_pretrained(tmp)
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {**self._meta(version), "total_size": total}, "weight_map": dict.fromkeys(tensors, "model.safetensors")}
        _write_json(tmp / INDEX, index)
        return Published(str(tmp), True, 1.0, (tmp / "model.safetensors").stat().st_size)

    def _write_delta(self, tmp: Path, arrays: dict[str, np.ndarray], version: int) -> Published:
        import safetensors.numpy

        if arrays.keys() != self.snapshot.keys():
            raise ValueError(f"disk-delta: the tensors changed names since the last sync (new {sorted(arrays.keys() - self.snapshot.keys())[:3]}, "
                             f"gone {sorted(self.snapshot.keys() - arrays.keys())[:3]}); a delta needs the same set")
        delta, sums, changed, total = {}, {}, 0, 0
        for name, new in arrays.items():
            old = self.snapshot[name]
            if new.size != old.size:
                raise ValueError(f"disk-delta: {name} has {new.size} bytes, {old.size} at the last sync")
            diff, n = encode(new, old, self.encoding)
            total += new.size
            if diff is not None:
                delta[name], sums[name] = zstd_compress(diff), checksum(self.checksum_format, new)
                changed += n
        wire = 0
        if delta:
            blob = safetensors.numpy.save(delta, metadata=sums)
            (tmp / DELTA_FILE).write_bytes(blob)
            wire = len(blob)
        meta = {**self._meta(version), "base_version": f"{self.last[0]:06d}", "delta_encoding": self.encoding,
                "compression_format": "zstd", "checksum_format": self.checksum_format}
        _write_json(tmp / INDEX, {"metadata": meta, "weight_map": dict.fromkeys(delta, DELTA_FILE)})
        return Published(str(tmp), False, changed / max(total, 1), wire)


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---- the engine's side ------------------------------------------------------------------------------------------------
def pull(local_checkpoint_dir: str | Path, source_dir: str | Path, target_version: int) -> int:
    """Bring ``local_checkpoint_dir`` to ``target_version`` of ``source_dir``: continue its chain when it holds an
    earlier version of the same stream, else copy the newest full version at or below the target; then apply the
    deltas after it in order. Safe to call from several engines sharing the dir (a file lock; a second call finds the
    version applied). -> the version it holds. Raises DeltaError (nothing of that delta written) or FileNotFoundError."""
    local, source = Path(local_checkpoint_dir), Path(source_dir)
    with _pull_lock(local):
        state = read_state(local)
        start = target_version
        while True:
            meta = _index(version_dir(source, start))["metadata"]
            if state is not None and state == (start, meta.get("stream")):
                break  # the local checkpoint holds this version of this stream: continue from it
            if "delta_encoding" not in meta:
                _reset(version_dir(source, start), local, start, meta.get("stream"))
                break
            start -= 1
            if start < 0:
                raise FileNotFoundError(f"{source}: no full version at or below weight_v{target_version:06d} to seed "
                                        f"{local} from")
        for version in range(start + 1, target_version + 1):
            apply_delta(local, version_dir(source, version))
    return target_version


def _index(vdir: Path) -> dict:
    try:
        return json.loads((vdir / INDEX).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"published weight version missing: {vdir / INDEX}") from None


@contextmanager
def _pull_lock(local: Path):
    (local / SYNC_DIR).mkdir(parents=True, exist_ok=True)
    with open(local / SYNC_DIR / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_state(local: str | Path) -> tuple[int, str | None] | None:
    """(version, stream) the local checkpoint holds, None when it holds no valid one."""
    try:
        state = json.loads((Path(local) / SYNC_DIR / "state.json").read_text())
    except FileNotFoundError:
        return None
    return int(state["version"]), state.get("stream")


def _write_state(local: Path, version: int, stream: str | None) -> None:
    _write_json(local / SYNC_DIR / "state.json", {"version": f"{version:06d}", "stream": stream})


def _invalidate(local: Path) -> None:
    (local / SYNC_DIR / "state.json").unlink(missing_ok=True)


def _reset(src: Path, local: Path, version: int, stream: str | None) -> None:
    """``local`` := an exact copy of the full version ``src`` (files it lacks removed)."""
    local.mkdir(parents=True, exist_ok=True)
    _invalidate(local)
    files = [e for e in os.scandir(src) if e.is_file()]
    for e in files:
        shutil.copy2(e.path, local / e.name)
        if (local / e.name).stat().st_size != e.stat().st_size:
            raise DeltaError(f"copying {e.path}: {e.stat().st_size} bytes, {(local / e.name).stat().st_size} copied")
    names = {e.name for e in files}
    for e in os.scandir(local):
        if e.is_file() and e.name not in names:
            os.remove(e.path)
    _write_state(local, version, stream)


def _safetensors_layout(path: Path) -> tuple[int, dict]:
    """(data start, header) of a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return 8 + n, json.loads(f.read(n))


def _locations(local: Path) -> dict[str, tuple[Path, int, int]]:
    """{tensor name: (file, byte offset, nbytes)} over the local checkpoint's safetensors files."""
    out = {}
    for path in sorted(local.glob("*.safetensors")):
        start, header = _safetensors_layout(path)
        for name, info in header.items():
            if name != "__metadata__":
                begin, end = info["data_offsets"]
                out[name] = (path, start + begin, end - begin)
    return out


def apply_delta(local: str | Path, vdir: str | Path) -> None:
    """Apply one delta version onto ``local``: every tensor decoded and its checksum verified first; only when all pass
    are the bytes written (in place) and the marker advanced. DeltaError otherwise, with nothing written."""
    local, vdir = Path(local), Path(vdir)
    index = _index(vdir)
    meta = index["metadata"]
    version, base, stream = int(meta["version"]), int(meta["base_version"]), meta.get("stream")
    state = read_state(local)
    if state == (version, stream):
        return
    if state != (base, stream):
        raise DeltaError(f"{vdir.name}: out of order: it builds on version {base}, the local checkpoint {local} holds "
                         f"{'no valid version' if state is None else f'version {state[0]}'}"
                         f"{' of another run' if state is not None and state[1] != stream else ''}")
    if meta.get("compression_format") != "zstd":
        raise DeltaError(f"{vdir.name}: compression {meta.get('compression_format')!r} is not supported (zstd)")
    encoding, algorithm = meta["delta_encoding"], meta["checksum_format"]
    if encoding not in ENCODINGS or algorithm not in CHECKSUMS:
        raise DeltaError(f"{vdir.name}: encoding {encoding!r} / checksum {algorithm!r} not supported "
                         f"({ENCODINGS} / {CHECKSUMS})")
    writes = _verified_writes(local, vdir, index["weight_map"], encoding, algorithm)
    _invalidate(local)  # a crash mid-write leaves no valid marker: the next pull reseeds from a full version
    for path, items in writes.items():
        with open(path, "r+b") as f:
            for offset, new in items:
                f.seek(offset)
                f.write(new.tobytes())
            f.flush()
            os.fsync(f.fileno())
    _write_state(local, version, stream)


def _verified_writes(local: Path, vdir: Path, weight_map: dict[str, str], encoding: str,
                     algorithm: str) -> dict[Path, list[tuple[int, np.ndarray]]]:
    """{local file: [(offset, new bytes)]} of every tensor of the delta, each checksum verified; DeltaError naming the
    tensors whose new bytes do not match (nothing is written by the caller then)."""
    locations = _locations(local)
    by_file: dict[str, set[str]] = {}
    for name, filename in weight_map.items():
        by_file.setdefault(filename, set()).add(name)
    writes: dict[Path, list[tuple[int, np.ndarray]]] = {}
    bad = []
    for filename, expected in sorted(by_file.items()):
        start, header = _safetensors_layout(vdir / filename)
        sums = header.get("__metadata__") or {}
        if header.keys() - {"__metadata__"} != expected:
            raise DeltaError(f"{vdir / filename}: its tensors are not the ones the index maps to it")
        blob = (vdir / filename).read_bytes()
        for name in sorted(expected):
            if name not in locations:
                raise DeltaError(f"{vdir.name}: {name} is not in the local checkpoint {local}")
            path, offset, nbytes = locations[name]
            with open(path, "rb") as f:
                f.seek(offset)
                old = np.frombuffer(f.read(nbytes), np.uint8)
            begin, end = header[name]["data_offsets"]
            try:
                new = decode(old, zstd_decompress(blob[start + begin:start + end]), encoding)
            except (DeltaError, OSError, ValueError, IndexError) as e:  # pyarrow raises OSError on a corrupt frame
                bad.append(f"{name} ({e})")
                continue
            if new.size != nbytes or checksum(algorithm, new) != sums.get(name):
                bad.append(name)
                continue
            writes.setdefault(path, []).append((offset, new))
    if bad:
        raise DeltaError(f"{vdir.name}: {len(bad)} tensor(s) fail their {algorithm} checksum: {', '.join(bad[:5])}; nothing "
                         f"of it was applied (the local checkpoint stays at its version)")
    return writes

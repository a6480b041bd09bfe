"""Weight sync trainer -> engines in buckets of at most ``update_weight_buffer_size`` bytes.

Sequence (REFERENCE §6, with SGLang 0.5.23's session rule): pause generation -> flush cache ->
[begin_weight_update] -> buckets -> [end_weight_update] -> set weight version -> continue. Tensor and
broadcast updates run inside a weight-update session (SGLang refuses them outside one:
managers/scheduler_components/weight_updater.py ~192-196, ~234-238); a disk reload needs none.
A single tensor larger than the bucket size travels alone.

A failed sync resumes every engine it paused (healthy or not), closes the sessions it opened, and
raises WeightSyncError naming the engines and the weight version (the run fails; its rerun resumes
from the last checkpoint and syncs again).

    sync_weights   the local runtime: tensors copied into an in-process engine
    sync_adapter   lora_sync_from_tensor: the LoRA adapter alone, loaded into engines that serve it unmerged
                   (WeightSync does it too: by disk, SGLang's /load_lora_adapter, or as tensors)
    sync_delta     the local runtime with disk-delta: publish, pull into the engine's local checkpoint, reload it
    WeightSync     the Ray runtime: modes tensor / broadcast / disk / disk-delta into engine servers (docs/ray.md)
    WeightSender   the trainer side of WeightSync (train rank 0)
"""

from __future__ import annotations

import logging
import math
import shutil
import socket
import sys
import time
import uuid
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

NamedTensors = Iterable[tuple[str, torch.Tensor]]
log = logging.getLogger(__name__)


class WeightSyncError(RuntimeError):
    """A weight sync failed on at least one engine; every engine it paused generates again, at the version it had."""


def sync_point(version: int) -> str:
    """Which weights a sync to ``version`` carries (one sync before rollout 0 -> version 1; after rollout i -> i + 2)."""
    return "before rollout 0" if version <= 1 else f"after rollout {version - 2}"


def iter_buckets(named_tensors: NamedTensors, max_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named_tensors:
        nbytes = t.numel() * t.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes
    if bucket:
        yield bucket


def _paused(engines: list, version: int, push) -> dict[str, float]:
    """pause -> flush -> ``push()`` -> version -> continue, on every engine. -> perf metrics. A failure leaves the
    engines generating again at the version they had (the caller does not bump its own)."""
    t0 = time.perf_counter()
    for e in engines:
        e.pause_generation()
    try:
        for e in engines:
            e.flush_cache()
        push()
        for e in engines:
            e.set_weight_version(version)
    finally:
        for e in engines:
            e.continue_generation()
    return {"perf/update_weights_time": time.perf_counter() - t0}


def sync_weights(named_tensors: NamedTensors, engines: list, version: int, max_bytes: int) -> dict[str, float]:
    """Push weights into every engine (tensor mode, same process), in one weight-update session. -> perf metrics."""
    def push() -> None:
        for e in engines:
            e.begin_weight_update()
        try:
            for bucket in iter_buckets(named_tensors, max_bytes):
                for e in engines:
                    e.update_weights_from_tensor(bucket)
        finally:
            for e in engines:
                e.end_weight_update()

    return _paused(engines, version, push)


# ---- adapters (lora_sync_from_tensor) ------------------------------------------------------------------
LORA_ADAPTER_NAME = "miles_lora"  # the reference's name of the one adapter (miles/utils/lora.py)


def sync_adapter(adapter: tuple[dict, list[tuple[str, torch.Tensor]]], engines: list, version: int,
                 check: bool = False) -> dict[str, float]:
    """lora_sync_from_tensor, in process: the adapter reloaded on every engine, paused as a weight sync. No weight-update
    session (SGLang's load_lora_adapter_from_tensors needs none) and no base tensors (the engines keep hf_checkpoint's,
    which the trainer never changes). ``check`` (check_lora_weight_equal): the sender's sha256 per tensor goes with
    it and an engine refuses an adapter that does not hash to them."""
    from .disk import adapter_checksums

    config, tensors = adapter
    sums = adapter_checksums(tensors) if check else None

    def push() -> None:
        for e in engines:
            e.reload_lora_adapter(LORA_ADAPTER_NAME, config, tensors, sums)

    return _paused(engines, version, push)


# ---- disk-delta (update_weight_transfer_mode disk-delta; weights/delta.py has the formats) ------------------------
@dataclass(frozen=True)
class DeltaOptions:
    """disk-delta: where the trainer publishes (``disk_dir``), the engines' local checkpoint (``local_dir``), the
    encoding and checksum, and the post-write hook (custom_update_weight_post_write_path) with the ``args`` it gets."""

    disk_dir: str
    local_dir: str
    encoding: str = "xor"
    checksum: str = "xxh3-128"
    hook: Callable | None = None
    hook_args: object = None

    def post_write(self, version_dir: str, engines: list) -> None:
        """The reference's hook(args, version_dir, rollout_engines), after a version's files are written."""
        if self.hook is not None:
            self.hook(self.hook_args, version_dir, engines)


def sync_delta(named_tensors: NamedTensors, engines: list, version: int, publisher, options: DeltaOptions) -> dict[str, float]:
    """disk-delta into in-process engines: publish (``publisher``: a weights/delta.py DeltaPublisher) -> hook -> every
    engine pulls it into its local checkpoint (verified; while it generates, as the reference pulls before pausing)
    -> pause -> each reloads the local checkpoint -> version -> continue. A refused delta raises before any pause."""
    published = publisher.publish(named_tensors, version, full=publisher.refused)
    options.post_write(published.version_dir, engines)
    try:
        for e in engines:
            e.pull_weights(options.disk_dir, options.local_dir, version)
    except BaseException:
        publisher.refused = True  # the next sync publishes in full: no engine holds this version's bytes
        raise
    publisher.refused = False

    def push() -> None:
        for e in engines:
            e.update_weights_from_disk(options.local_dir)

    return {**_paused(engines, version, push), **published.metrics()}


# ---- modes: trainer -> engine servers (the Ray runtime) ------------------------------------------------
MODES = ("tensor", "broadcast", "disk", "disk-delta")
PAUSE_MODES = ("abort", "retract", "in_place")  # SGLang 0.5.23 PauseGenerationReqInput.mode (io_struct.py)


def _dtype_size(dtype: str) -> int:
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


def iter_meta_buckets(names: list[str], dtypes: list[str], shapes: list[list[int]], max_bytes: int) -> Iterator[range]:
    """Index ranges of buckets of at most ``max_bytes`` over tensor metadata (as iter_buckets does on tensors)."""
    start, size = 0, 0
    for i, (dtype, shape) in enumerate(zip(dtypes, shapes)):
        nbytes = math.prod(shape) * _dtype_size(dtype)
        if i > start and size + nbytes > max_bytes:
            yield range(start, i)
            start, size = i, 0
        size += nbytes
    if start < len(names):
        yield range(start, len(names))


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A detached copy of ``t`` on the CPU (a copy also when it already is there)."""
    return t.detach().to("cpu", copy=True)


def node_address() -> str:
    """The address engines on other nodes reach this process at: in a Ray worker or driver, the address its Ray node
    reports (what Ray's own nodes connect to; the host name may resolve to a loopback such as 127.0.1.1), else the host
    name's. Ray is not imported here: it is only asked when this process already is part of a Ray cluster."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return ray.util.get_node_ip_address()
    return socket.gethostbyname(socket.gethostname())


class WeightSender:
    """The trainer's side of a sync (train rank 0, or the model in process for tests).

    ``named_tensors()`` -> HF-format (name, tensor) of the current weights; ``hf_config`` is written
    next to the weights in disk mode (a real SGLang needs config.json to reload)."""

    def __init__(self, named_tensors: Callable[[], Iterable[tuple[str, torch.Tensor]]], hf_config=None,
                 adapter: Callable[[], tuple[dict, list[tuple[str, torch.Tensor]]]] | None = None):
        """``adapter``: -> (adapter_config.json, the PEFT-named adapter tensors), for lora_sync_from_tensor."""
        self._named, self.hf_config, self._adapter = named_tensors, hf_config, adapter
        self.group, self.device = None, "cpu"
        self._store = None  # rank 0's store of the next group, listening since master_address

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        """CPU copies (they travel to the driver through Ray's object store, which may see no GPU)."""
        return [(k, host_copy(v)) for k, v in self._named()]

    def adapter(self) -> tuple[dict, list[tuple[str, torch.Tensor]]]:
        config, tensors = self._adapter()
        return config, [(k, host_copy(v)) for k, v in tensors]

    def checksums(self) -> dict[str, str]:
        """{name: sha256 hex} of the tensors a sync sends, hashed where they are (save_local_weight_checksum)."""
        from .disk import adapter_checksums

        return adapter_checksums(self._named())

    def save_adapter(self, path: str) -> str:
        """The adapter as a PEFT dir at ``path`` (atomic), for engines that read it (/load_lora_adapter). -> path."""
        from .disk import save_adapter_dir

        config, tensors = self._adapter()
        return str(save_adapter_dir(config, list(tensors), path))

    def meta(self) -> tuple[list[str], list[str], list[list[int]]]:
        from .broadcast import tensor_meta

        return tensor_meta(list(self._named()))

    def master_address(self) -> tuple[str, int]:
        """(this process's node address, a port) for a new broadcast group hosted here (node_address): the port of
        the group's store, already listening, which init_broadcast then uses."""
        from .broadcast import master_store

        host = node_address()
        self._store = master_store(host)
        return host, self._store.port

    def init_broadcast(self, host: str, port: int, world_size: int, backend: str, group_name: str) -> None:
        """Join group ``group_name`` as rank 0, as SGLang forms it (blocks until every engine rank joined), on the
        store master_address opened for ``port`` (else a rendezvous of its own at host:port)."""
        from .broadcast import destroy_group, init_custom_process_group, tcp_address

        old, self.group = self.group, None
        destroy_group(old)  # drop the previous group first
        store, self._store = (self._store, None) if self._store is not None and self._store.port == port else (None, None)
        self.group = init_custom_process_group(backend, tcp_address(host, port), world_size, 0, group_name, store=store)
        self.device = "cuda" if backend == "nccl" else "cpu"

    def broadcast(self, names: list[str]) -> None:
        from .broadcast import send

        named = dict(self._named())
        send(self.group, [named[n] for n in names], self.device)

    def save(self, path: str) -> str:
        from .disk import save_hf_weights

        return str(save_hf_weights(list(self._named()), path, self.hf_config))

    def publish_delta(self, disk_dir: str, version: int, encoding: str, checksum: str, full: bool = False):
        """disk-delta: publish ``version`` under ``disk_dir`` (a full version first, or with ``full``; else a delta
        against the last one this sender published; its snapshot stays here, on train rank 0). -> delta.py Published."""
        from .delta import DeltaPublisher

        if getattr(self, "_publisher", None) is None:
            self._publisher = DeltaPublisher(disk_dir, encoding, checksum)
        return self._publisher.publish(self._named(), version, self.hf_config, full=full)


class WeightSync:
    """One run's weight sync, driver side: pause -> flush -> [session] buckets (by ``mode``) -> set version -> continue,
    over the engines healthy at its start (every one must take it).

    tensor     the driver fetches the sender's tensors and POSTs safetensors buckets (/update_weights_from_tensor)
    broadcast  a process group of the sender and every engine TP rank (created on the first sync, again when the
               engine set changed); per bucket /update_weights_from_distributed carries names/dtypes/shapes
               while the sender broadcasts the bytes
    disk       the sender saves <disk_dir>/v<version> atomically; engines /update_weights_from_disk
    disk-delta (``delta``: DeltaOptions) before pausing, the sender publishes the version (sender.publish_delta), the
               hook runs, every engine /pull_weights it into its local checkpoint; then /update_weights_from_disk of
               that checkpoint (the reference's UpdateWeightFromDiskDelta._reload_engines)
    ``lora_adapter`` (lora_sync_from_tensor): the adapter alone reloaded on every engine (/unload_lora_adapter where loaded,
    then a load), outside a session, as sync_adapter: mode disk, the sender saves the PEFT dir <disk_dir>/lora-v<version>
    and the engines read it (SGLang's /load_lora_adapter {lora_name, lora_path}); otherwise the tensors travel in the
    body (/load_lora_adapter_from_tensors, sender.adapter()), with ``check_adapter`` (check_lora_weight_equal) SGLang's
    expected_checksums beside them.
    ``router`` is an EngineRouter (the engines); ``sender`` a WeightSender or a proxy with its methods.
    ``pause_mode`` is SGLang's /pause_generation mode (pause_generation_mode); in_place keeps the engines' KV cache,
    so no /flush_cache follows it (the reference's _pause_and_prepare_engines).
    """

    SESSION = {"tensor": True, "broadcast": True, "disk": False, "disk-delta": False}  # inside begin/end_weight_update

    def __init__(self, mode: str, bucket_bytes: int, disk_dir: str | Path | None = None, backend: str = "gloo",
                 lora_adapter: bool = False, pause_mode: str = "retract", check_adapter: bool = False,
                 delta: DeltaOptions | None = None):
        if mode not in MODES:
            raise ValueError(f"weight sync mode {mode!r}: expected one of {MODES}")
        if mode == "disk" and disk_dir is None:
            raise ValueError("weight sync mode disk needs a directory (disk_dir)")
        if (mode == "disk-delta") != (delta is not None):
            raise ValueError("weight sync mode disk-delta needs its DeltaOptions (delta), and only it takes them")
        self.delta, self._delta_refused = delta, False
        if pause_mode not in PAUSE_MODES:
            raise ValueError(f"pause mode {pause_mode!r}: expected one of {PAUSE_MODES}")
        self.mode, self.bucket_bytes, self.backend, self.pause_mode = mode, bucket_bytes, backend, pause_mode
        if check_adapter and (not lora_adapter or mode == "disk"):
            raise ValueError("check_adapter checks an adapter sent as tensors (lora_adapter, mode tensor): SGLang's "
                             "/load_lora_adapter has no expected_checksums")
        self.lora_adapter, self.check_adapter = lora_adapter, check_adapter
        self.disk_dir = Path(disk_dir) if disk_dir is not None else None
        self._group_key: tuple[str, ...] | None = None
        self._groups = 0
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="miles-weight-sync")

    def sync(self, sender, router, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        slots = router.weight_targets()
        extra: dict[str, float] = {}
        if self.mode == "disk-delta" and not self.lora_adapter:
            try:  # disk only: the engines keep generating meanwhile
                extra = self._pull_delta(sender, router, slots, version)
            except Exception as e:
                raise WeightSyncError(f"weight sync (disk-delta) to version {version} ({sync_point(version)}) failed "
                                      f"before any engine paused: {e}") from e
        try:
            router.pause_generation(slots, self.pause_mode)
            if self.pause_mode != "in_place":  # in_place resumes on the engines' KV cache: not flushed
                router.flush_cache(slots)
            if self.lora_adapter:
                self._push_adapter(sender, router, slots, version)
            else:
                push = getattr(self, f"_push_{self.mode.replace('-', '_')}")
                self._in_session(router, slots, lambda: push(sender, router, slots, version))
            router.set_weight_version(version, slots)
        except Exception as e:  # every engine paused here generates again, healthy or not, at the version it had
            _quietly("continue_generation", lambda: router.continue_generation(slots))
            raise WeightSyncError(f"weight sync ({'lora adapter' if self.lora_adapter else self.mode}) to version {version} ({sync_point(version)}) failed: {e}") from e
        router.continue_generation(slots)
        return {"perf/update_weights_time": time.perf_counter() - t0, **extra}

    def _in_session(self, router, slots, push: Callable[[], None]) -> None:
        if not self.SESSION[self.mode]:
            push()
            return
        router.begin_weight_update(slots)
        try:
            push()
        except BaseException:
            _quietly("end_weight_update", lambda: router.end_weight_update(slots))
            raise
        router.end_weight_update(slots)

    def _push_adapter(self, sender, router, slots, version: int) -> None:
        if self.mode == "disk":
            path = sender.save_adapter(str(self.disk_dir / f"lora-v{version}"))
            router.reload_lora_adapter_from_path(LORA_ADAPTER_NAME, path, slots)
            self._prune(f"lora-v{version}")
            return
        from .disk import adapter_checksums

        config, tensors = sender.adapter()
        router.reload_lora_adapter(LORA_ADAPTER_NAME, config, tensors, slots,
                                   adapter_checksums(tensors) if self.check_adapter else None)

    def _prune(self, keep: str) -> None:
        """Drop the older synced dirs; keep the one the engines serve (a restarted engine reloads it)."""
        for old in self.disk_dir.glob("*v*"):
            if old.name != keep and old.name.removeprefix("lora-").startswith("v"):
                shutil.rmtree(old, ignore_errors=True)

    def _push_tensor(self, sender, router, slots, version: int) -> None:
        router.update_weights_from_tensor(sender.tensors(), slots)

    def _push_disk(self, sender, router, slots, version: int) -> None:
        path = sender.save(str(self.disk_dir / f"v{version}"))
        router.update_weights_from_disk(path, version, slots)
        self._prune(f"v{version}")

    def _pull_delta(self, sender, router, slots, version: int) -> dict[str, float]:
        d = self.delta
        published = sender.publish_delta(d.disk_dir, version, d.encoding, d.checksum, self._delta_refused)
        d.post_write(published.version_dir, [s.client for s in slots])
        self._delta_refused = True  # until every engine pulled it: the next sync then publishes in full
        router.pull_weights(d.disk_dir, d.local_dir, version, slots)
        self._delta_refused = False
        return published.metrics()

    def _push_disk_delta(self, sender, router, slots, version: int) -> None:
        router.update_weights_from_disk(self.delta.local_dir, version, slots)

    def _push_broadcast(self, sender, router, slots, version: int) -> None:
        key = tuple(s.url for s in slots)
        if key != self._group_key:
            self._groups += 1  # a name once per process (torch registers it): unique across syncs and runs
            self._group_name = f"miles-weights-{uuid.uuid4().hex[:12]}-{self._groups}"
            host, port = sender.master_address()
            ranks = router.group_ranks(slots)
            self._together(lambda: router.init_weights_update_group(slots, host, port, self._group_name, self.backend, ranks),
                           lambda: sender.init_broadcast(host, port, ranks[1], self.backend, self._group_name))
            self._group_key = key
        names, dtypes, shapes = sender.meta()
        for idx in iter_meta_buckets(names, dtypes, shapes, self.bucket_bytes):
            b_names, b_dtypes, b_shapes = [names[i] for i in idx], [dtypes[i] for i in idx], [shapes[i] for i in idx]
            try:
                self._together(lambda: router.update_weights_from_distributed(slots, b_names, b_dtypes, b_shapes, self._group_name),
                               lambda: sender.broadcast(b_names))
            except Exception:
                self._group_key = None  # a failed collective leaves the group unusable: a new one next time
                raise

    def _together(self, engines_side: Callable[[], object], sender_side: Callable[[], object]) -> None:
        """Run the engines' HTTP calls and the sender's collective at the same time; the first failure of either
        raises at once (an engine that refuses the call never joins the collective the sender waits in)."""
        futures = [self._pool.submit(engines_side), self._pool.submit(sender_side)]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for f in done:
            if f.exception() is not None:
                raise f.exception()
        for f in futures:
            f.result()

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def _quietly(what: str, fn: Callable[[], object]) -> None:
    """Clean-up after a failure: log its own failure instead of hiding the first one."""
    try:
        fn()
    except Exception:  # noqa: BLE001 - the sync's own error is the one raised
        log.exception("weight sync clean-up %s failed", what)

"""EngineRouter: the RolloutEngine protocol over N engine clients.

generate(requests, seed):
  1. request i gets seed request_seed(seed, i) (its global index), so its result does not depend
     on the engine or the sub-batch that serves it (with servers in "exact" batching, bit for bit);
  2. the batch is cut into chunks (``chunk_size``; default: about 4 chunks per healthy engine),
     sent concurrently; each chunk goes to an eligible engine by ``policy`` (POLICIES): by default the
     one with the fewest requests in flight from this router (ties: the lower index);
  3. a chunk whose engine fails (unreachable, timeout, HTTP 5xx) is sent again to another healthy
     engine, at most ``max_attempts`` engines in all; the failed engine is marked unhealthy. A
     result is written once, by the attempt that returned it: no request is lost or duplicated.
     HTTP 4xx (a bad request) is raised at once, never retried.

Concurrency: at most ``max_in_flight`` requests are in flight from this router over all engines (chunks are cut
no larger; a chunk waits for room), the bound of the reference's rollout semaphore and MilesRouter connection pool
(sglang_server_concurrency per engine, miles_router_max_connections in all).

Health: an engine is unhealthy after ``max_failures`` consecutive failures or a failed health
check. Unhealthy engines are probed again (GET /health_generate, then GET /model_info) at most
every ``recheck_s`` seconds, at the start of a call. An engine serves generate only if healthy and,
once a version has been set through the router, at the router's weight version: an engine that
missed a weight sync stays out of generate until the next full sync reaches it.

Weight and control calls (pause, continue, flush, sessions, buckets, versions, disk, memory) go to
every healthy engine in parallel; an engine that fails one is marked unhealthy; the call raises only
if no engine succeeded. Given ``slots`` (a weight sync's fixed engine set, ``weight_targets()``), a
call goes to exactly those engines, healthy or not, and raises if any of them failed (a sync needs
every member; WeightSync then resumes all of them).

Broadcast groups (SGLang's rule, model_runner_components/weight_updater.py: rank = rank_offset +
tp_rank): the sender is rank 0; engine j's offset is 1 + the TP sizes of the engines before it, the
world 1 + the sum of all TP sizes (``group_ranks``).
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from miles_core.rollout.hf_engine import SeededGenerate
from miles_core.rollout.protocol import GenerateRequest, GenerateResult
from miles_core.weights.sync import iter_buckets

from . import wire
from .client import EngineError, EngineHTTPError, HTTPEngineClient

log = logging.getLogger(__name__)


# How a chunk picks among the eligible engines (sglang_router_policy; None: least_loaded, the reference's MilesRouter).
POLICIES = ("least_loaded", "round_robin", "random", "power_of_two")


class NoHealthyEngine(RuntimeError):
    """Every engine is unhealthy (or failed this request)."""


@dataclass(eq=False)
class EngineSlot:
    client: HTTPEngineClient
    healthy: bool = True
    in_flight: int = 0  # requests this router has sent and not yet got back
    failures: int = 0  # consecutive
    served: int = 0  # requests answered, over the router's life
    version: int | None = None  # last version known to be on the engine
    checked_at: float = field(default=0.0)
    last_error: str | None = None

    @property
    def url(self) -> str:
        return self.client.base_url


def is_retryable(e: EngineError) -> bool:
    """Transport errors and 5xx move to another engine; 4xx is the caller's mistake."""
    return not isinstance(e, EngineHTTPError) or (e.status or 500) >= 500


class EngineRouter(SeededGenerate):
    def __init__(self, clients: list[HTTPEngineClient], *, chunk_size: int | None = None, max_attempts: int = 3,
                 max_failures: int = 1, recheck_s: float = 5.0, bucket_bytes: int | None = None,
                 max_in_flight: int | None = None, policy: str = "least_loaded"):
        if not clients:
            raise ValueError("EngineRouter needs at least one engine client")
        if policy not in POLICIES:
            raise ValueError(f"router policy {policy!r}: expected one of {POLICIES}")
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.slots = [EngineSlot(c) for c in clients]
        self.chunk_size, self.max_attempts = chunk_size, max_attempts
        self.max_failures, self.recheck_s, self.max_in_flight, self.policy = max_failures, recheck_s, max_in_flight, policy
        self._turn, self._rng = 0, random.Random(0)  # round_robin's next turn; random / power_of_two draws (results never
        # depend on routing: every request carries its own seed)
        self.bucket_bytes = bucket_bytes or clients[0].bucket_bytes
        self.weight_version: int | None = None  # set by set_weight_version / update_weights_from_disk
        self._lock = threading.Condition()  # guards the slots; notified when requests in flight come back
        self._pool = ThreadPoolExecutor(max(4, 8 * len(clients)), thread_name_prefix="miles-router")

    @classmethod
    def from_urls(cls, urls: list[str], client_kwargs: dict[str, Any] | None = None, **router_kwargs) -> "EngineRouter":
        """Clients fail fast by default (1 retry): the router does the failing over."""
        kw = {"max_retries": 1, "backoff_s": 0.05, **(client_kwargs or {})}
        return cls([HTTPEngineClient(u, **kw) for u in urls], **router_kwargs)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for s in self.slots:
            s.client.close()

    def __enter__(self) -> "EngineRouter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- generation -------------------------------------------------------------------------------
    def generate_seeded(self, requests: list[GenerateRequest], seeds: list[int]) -> list[GenerateResult]:
        if len(seeds) != len(requests):
            raise ValueError(f"{len(requests)} requests but {len(seeds)} seeds")
        self.recheck()
        n_healthy = max(1, sum(self._eligible(s) for s in self.slots))
        size = self.chunk_size or max(1, math.ceil(len(requests) / (4 * n_healthy)))
        size = min(size, self.max_in_flight or size)
        results: list[GenerateResult | None] = [None] * len(requests)
        futures = [self._pool.submit(self._run_chunk, range(a, min(a + size, len(requests))), requests, seeds, results)
                   for a in range(0, len(requests), size)]
        for f in as_completed(futures):
            f.result()  # the first chunk that failed everywhere raises
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def _run_chunk(self, idx: range, requests, seeds, results: list) -> None:
        reqs, chunk_seeds = [requests[i] for i in idx], [seeds[i] for i in idx]
        tried: list[EngineSlot] = []
        errors: list[str] = []
        while len(tried) < self.max_attempts:
            slot = self._acquire(len(idx), exclude=tried)
            if slot is None:
                break
            tried.append(slot)
            try:
                out = slot.client.generate_seeded(reqs, chunk_seeds)
            except EngineError as e:
                self._release(slot, len(idx), e)
                if not is_retryable(e):
                    raise
                errors.append(str(e))
                continue
            self._release(slot, len(idx), None)
            for i, res in zip(idx, out):
                results[i] = res
            return
        raise NoHealthyEngine(f"requests {idx.start}..{idx.stop - 1} failed on {len(tried)} engine(s): {errors or self.why_none()}")

    def _eligible(self, slot: EngineSlot) -> bool:
        return slot.healthy and (self.weight_version is None or slot.version in (None, self.weight_version))

    def _acquire(self, n: int, exclude: list[EngineSlot]) -> EngineSlot | None:
        """The eligible engine with the fewest requests in flight (ties: lower index); counts n on it. Waits while
        max_in_flight requests are out (None: no eligible engine)."""
        with self._lock:
            while True:
                candidates = [s for s in self.slots if self._eligible(s) and s not in exclude]
                if not candidates:
                    return None
                if self.max_in_flight is None or sum(s.in_flight for s in self.slots) + n <= self.max_in_flight:
                    break
                self._lock.wait(1.0)  # a release notifies; the timeout re-reads the engines' health
            slot = self._pick(candidates)
            slot.in_flight += n
            return slot

    def _pick(self, candidates: list[EngineSlot]) -> EngineSlot:
        """One of the eligible engines by the policy (caller holds the lock)."""
        if self.policy == "round_robin":
            self._turn += 1
            return candidates[(self._turn - 1) % len(candidates)]
        if self.policy == "random":
            return self._rng.choice(candidates)
        if self.policy == "power_of_two" and len(candidates) > 2:
            candidates = self._rng.sample(candidates, 2)
        return min(candidates, key=lambda s: s.in_flight)

    def _release(self, slot: EngineSlot, n: int, error: EngineError | None) -> None:
        with self._lock:
            slot.in_flight -= n
            self._lock.notify_all()
            if error is None:
                slot.failures, slot.served = 0, slot.served + n
            elif is_retryable(error):
                self._mark_failure(slot, str(error))

    def _mark_failure(self, slot: EngineSlot, error: str, fatal: bool = False) -> None:
        """Count a failure (caller holds the lock); unhealthy after max_failures, or at once if fatal."""
        slot.failures += 1
        slot.last_error = error
        if (fatal or slot.failures >= self.max_failures) and slot.healthy:
            log.warning("engine %s marked unhealthy: %s", slot.url, error)
            slot.healthy = False
        slot.checked_at = time.monotonic()

    # ---- health -------------------------------------------------------------------------------------
    def check_health(self) -> dict[str, bool]:
        """Probe every engine now (health, then version). -> {url: healthy}."""
        list(self._pool.map(self._probe, self.slots))
        return {s.url: s.healthy for s in self.slots}

    def recheck(self) -> None:
        """Probe the unhealthy engines whose last check is older than recheck_s."""
        due = [s for s in self.slots if not s.healthy and time.monotonic() - s.checked_at >= self.recheck_s]
        list(self._pool.map(self._probe, due))

    def _probe(self, slot: EngineSlot) -> None:
        error, version = None, None
        if not slot.client.health():
            error = "health check failed"
        else:
            try:
                version = slot.client.get_weight_version()
            except EngineError as e:
                error = str(e)
        with self._lock:
            if error is None:
                slot.healthy, slot.failures, slot.version, slot.checked_at = True, 0, version, time.monotonic()
            else:
                self._mark_failure(slot, error, fatal=True)

    def mark_dead(self, index: int, error: str) -> None:
        """Engine ``index`` out of generate and of weight calls now (``error`` says why); probed again every recheck_s."""
        with self._lock:
            self._mark_failure(self.slots[index], error, fatal=True)

    def why_none(self) -> str:
        """Why no engine can serve: each one's address and what is wrong with it."""
        def why(s: EngineSlot) -> str:
            if not s.healthy:
                return s.last_error or "unhealthy"
            return f"at weight version {s.version}, the router's is {self.weight_version}"
        return "none healthy: " + "; ".join(f"{s.url} ({why(s)})" for s in self.slots if not self._eligible(s))

    def health(self) -> bool:
        self.recheck()
        return any(self._eligible(s) for s in self.slots)

    def status(self) -> list[dict[str, Any]]:
        """One row per engine: url, healthy, eligible, in_flight, served, version, last_error."""
        return [{"url": s.url, "healthy": s.healthy, "eligible": self._eligible(s), "in_flight": s.in_flight,
                 "served": s.served, "version": s.version, "last_error": s.last_error} for s in self.slots]

    # ---- broadcast: control and weights ----------------------------------------------------------------
    def _broadcast(self, what: str, fn: Callable[[HTTPEngineClient], Any], slots: list[EngineSlot] | None = None) -> list[EngineSlot]:
        """fn(client) in parallel on every healthy engine, or on exactly ``slots``. -> the slots where it succeeded.
        Raises if none succeeded, or (given ``slots``: a collective needs every member) if any failed."""
        if slots is None:
            self.recheck()
        targets = [s for s in self.slots if s.healthy] if slots is None else slots
        futures = {self._pool.submit(fn, s.client): s for s in targets}
        ok, errors = [], []
        for f in as_completed(futures):
            slot = futures[f]
            try:
                f.result()
                ok.append(slot)
            except EngineError as e:
                errors.append(str(e))
                with self._lock:  # an engine that missed a broadcast is out of step: out at once
                    self._mark_failure(slot, str(e), fatal=True)
        if not ok or (slots is not None and errors):
            raise NoHealthyEngine(f"{what} failed on {len(errors)} of {len(targets)} engine(s): {errors or self.why_none()}")
        return ok

    def pause_generation(self, slots: list[EngineSlot] | None = None, mode: str = "abort") -> None:
        """SGLang's /pause_generation with ``mode`` (abort, its default; retract; in_place) on every engine."""
        self._broadcast("pause_generation", lambda c: c.pause_generation(mode), slots)

    def continue_generation(self, slots: list[EngineSlot] | None = None) -> None:
        self._broadcast("continue_generation", lambda c: c.continue_generation(), slots)

    def flush_cache(self, slots: list[EngineSlot] | None = None) -> None:
        self._broadcast("flush_cache", lambda c: c.flush_cache(), slots)

    def check_weights(self, action: str, skip_list: list[str] | None = None, allow_quant_error: bool = False,
                      selector: str = "all") -> None:
        """The weights checker on every healthy engine; one failing engine fails the call."""
        self._broadcast("check_weights", lambda c: c.check_weights(action, skip_list, allow_quant_error, selector),
                        [s for s in self.slots if s.healthy])

    def weight_checksums(self) -> list[dict[str, str]]:
        """[{tensor name: digest}] per healthy engine, in slot order (save_local_weight_checksum)."""
        got: dict[int, list[dict[str, str]]] = {}
        ok = self._broadcast("weight_checksums", lambda c: got.__setitem__(id(c), c.weight_checksums()),
                             [s for s in self.slots if s.healthy])
        return [sums for s in self.slots if s in ok for sums in got[id(s.client)]]

    def abort(self) -> None:
        self._broadcast("abort", lambda c: c.abort())

    def configure_dumper(self, body_of: Callable[[int], dict]) -> None:
        """dumper_inference before a rollout: engine i (its slot) gets body_of(i) at /dumper/configure; every engine must
        take it (the reference's configure_sglang)."""
        index = {id(s.client): i for i, s in enumerate(self.slots)}
        self._broadcast("dumper configure", lambda c: c.dumper_control("configure", body_of(index[id(c)])),
                        [s for s in self.slots if s.healthy])

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        self._broadcast("release_memory_occupation", lambda c: c.release_memory_occupation(tags))

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self._broadcast("resume_memory_occupation", lambda c: c.resume_memory_occupation(tags))

    def begin_weight_update(self, slots: list[EngineSlot] | None = None) -> None:
        """Open SGLang's weight-update session (tensor and distributed updates only inside one)."""
        self._broadcast("begin_weight_update", lambda c: c.begin_weight_update(), slots)

    def end_weight_update(self, slots: list[EngineSlot] | None = None) -> None:
        self._broadcast("end_weight_update", lambda c: c.end_weight_update(), slots)

    def update_weights_from_tensor(self, named_tensors: Iterable[tuple[str, torch.Tensor]],
                                   slots: list[EngineSlot] | None = None) -> int:
        """Each bucket is encoded once and posted to every healthy engine (or to ``slots``). -> number of buckets."""
        n = 0
        for bucket in iter_buckets(named_tensors, self.bucket_bytes):
            payload = wire.encode_bucket(bucket)
            self._broadcast("update_weights_from_tensor", lambda c: c.post_weight_bucket(payload), slots)
            n += 1
        return n

    def reload_lora_adapter(self, lora_name: str, config: dict, tensors: list[tuple[str, torch.Tensor]],
                            slots: list[EngineSlot] | None = None, expected_checksums: dict[str, str] | None = None) -> None:
        """lora_sync_from_tensor: every engine (or ``slots``) unloads ``lora_name`` where loaded and loads these tensors."""
        self._broadcast("load_lora_adapter_from_tensors",
                        lambda c: c.reload_lora_adapter(lora_name, config, tensors, expected_checksums), slots)

    def reload_lora_adapter_from_path(self, lora_name: str, lora_path: str, slots: list[EngineSlot] | None = None) -> None:
        """lora_sync_from_tensor by disk: every engine (or ``slots``) unloads ``lora_name`` where loaded and loads the PEFT
        dir ``lora_path`` (/load_lora_adapter)."""
        self._broadcast("load_lora_adapter", lambda c: c.reload_lora_adapter_from_path(lora_name, lora_path), slots)

    def weight_targets(self) -> list[EngineSlot]:
        """The engines a sync goes to: the healthy ones now."""
        self.recheck()
        return [s for s in self.slots if s.healthy]

    def group_ranks(self, slots: list[EngineSlot]) -> tuple[list[int], int]:
        """(rank_offset of each slot, world size) of a broadcast group over ``slots`` (sender = rank 0)."""
        sizes = list(self._pool.map(lambda s: s.client.tp_size(), slots))
        offsets = [1 + sum(sizes[:j]) for j in range(len(slots))]
        return offsets, 1 + sum(sizes)

    def init_weights_update_group(self, slots: list[EngineSlot], host: str, port: int, group_name: str, backend: str,
                                  ranks: tuple[list[int], int]) -> None:
        """POST /init_weights_update_group on ``slots`` with ``ranks`` = group_ranks(slots)."""
        offsets, world = ranks
        offset = {id(s.client): o for s, o in zip(slots, offsets)}
        self._broadcast("init_weights_update_group",
                        lambda c: c.init_weights_update_group(host, port, offset[id(c)], world, group_name, backend), slots)

    def update_weights_from_distributed(self, slots: list[EngineSlot], names: list[str], dtypes: list[str],
                                        shapes: list[list[int]], group_name: str) -> None:
        self._broadcast("update_weights_from_distributed",
                        lambda c: c.update_weights_from_distributed(names, dtypes, shapes, group_name), slots)

    def replace_engine(self, index: int, client: HTTPEngineClient, version: int | None) -> None:
        """Engine ``index`` is now ``client`` (a restarted server) holding weights ``version``. Requests in
        flight on the old client fail and are retried elsewhere (they count on the old slot only)."""
        with self._lock:
            old = self.slots[index]
            self.slots[index] = EngineSlot(client, version=version, checked_at=time.monotonic())
        old.client.close()

    def update_weights_from_disk(self, model_path: str, weight_version: int | None = None,
                                 slots: list[EngineSlot] | None = None) -> None:
        done = self._broadcast("update_weights_from_disk", lambda c: c.update_weights_from_disk(model_path, weight_version), slots)
        if weight_version is not None:
            self._record_version(done, weight_version)

    def pull_weights(self, source_dir: str, local_checkpoint_dir: str, version: int,
                     slots: list[EngineSlot] | None = None) -> None:
        """disk-delta: every engine's local checkpoint to ``version`` (engines sharing the dir apply it once)."""
        self._broadcast("pull_weights", lambda c: c.pull_weights(source_dir, local_checkpoint_dir, version), slots)

    def set_weight_version(self, version: int, slots: list[EngineSlot] | None = None) -> None:
        self._record_version(self._broadcast("set_weight_version", lambda c: c.set_weight_version(version), slots), version)

    def _record_version(self, slots: list[EngineSlot], version: int) -> None:
        with self._lock:
            self.weight_version = version
            for s in slots:
                s.version = version

    def get_weight_version(self) -> int:
        if self.weight_version is not None:
            return self.weight_version
        return self._broadcast_first(lambda c: c.get_weight_version())

    def _broadcast_first(self, fn: Callable[[HTTPEngineClient], Any]) -> Any:
        for s in self.slots:
            if s.healthy:
                try:
                    return fn(s.client)
                except EngineError as e:
                    with self._lock:
                        self._mark_failure(s, str(e), fatal=True)
        raise NoHealthyEngine("no healthy engine answered")

    def engine_versions(self) -> dict[str, int | None]:
        """{url: weight version reported now, None if unreachable} (for pin checks)."""
        def read(slot: EngineSlot) -> int | None:
            try:
                return slot.client.get_weight_version()
            except EngineError:
                return None
        return dict(zip((s.url for s in self.slots), self._pool.map(read, self.slots)))

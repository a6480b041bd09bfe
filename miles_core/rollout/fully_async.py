"""Fully-async rollout: a background worker keeps a bounded buffer of scored groups.

The worker draws prompts (``round_groups`` at a time: async_max_concurrent_samples // G, else the
over-sampling or rollout batch size), generates a group of G responses each with the engine's current weights,
scores and filters them (dynamic sampling), and appends the kept groups to a buffer of at most
``capacity`` groups (it waits while the buffer is full). The trainer takes ``rollout_batch_size``
groups per rollout; a group generated more than ``max_weight_staleness`` weight syncs ago is not
trained on: its prompt is regenerated (``recycle``) or it is dropped (``drop``).

A weight sync, a checkpoint or an inline eval runs inside ``paused()``: no generation is in flight
and the buffer does not change. The buffer (groups and recycled prompts) is part of every
checkpoint, so a resumed run loses and repeats no prompt. Which weight version a group gets depends
on timing, so unlike async_mode off / one_step a fully-async run is not bit-reproducible.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from miles_core.data.dataset import Prompt
from miles_core.data.sample import Sample
from miles_core.data.source import DataSource
from miles_core.rewards import RewardOptions, batched_async_rm, reward_value

from .generate import RolloutSpec, generate_unfinished, new_group, spec_filter



class _RecyclingSource:
    """DataSource view that hands out recycled (group_index, prompt) pairs before new ones."""

    def __init__(self, source: DataSource, recycled: deque[tuple[int, Prompt]]):
        self.source, self.recycled = source, recycled

    def next_prompts(self, n: int) -> list[tuple[int, Prompt]]:
        out = [self.recycled.popleft() for _ in range(min(n, len(self.recycled)))]
        return out + (self.source.next_prompts(n - len(out)) if n > len(out) else [])


def _prompt_of(group: list[Sample]) -> tuple[int, Prompt]:
    s = group[0]
    return s.group_index, Prompt(s.prompt, list(s.tokens[: s.prompt_length]), s.label, dict(s.metadata))


class FullyAsyncWorker:
    """Producer thread + bounded buffer of scored groups. ``version`` returns the engines' weight version."""

    def __init__(self, engine, source: DataSource, spec: RolloutSpec, reward: RewardOptions, decode: Callable,
                 version: Callable[[], int], *, capacity: int, max_staleness: int | None, policy: str = "recycle",
                 round_groups: int | None = None):
        self.engine, self.source, self.spec, self.reward, self.decode = engine, source, spec, reward, decode
        self.version, self.capacity, self.max_staleness, self.policy = version, capacity, max_staleness, policy
        self.round_groups = round_groups or spec.over_sampling_batch_size or spec.rollout_batch_size  # groups generated at once
        self.keep_filter = spec_filter(spec)
        self.buffer: deque[list[Sample]] = deque()
        self.recycled: deque[tuple[int, Prompt]] = deque()
        self.rounds = 0  # generation rounds so far (seeds each round)
        self.drops: Counter[str] = Counter()
        self._cond = threading.Condition()
        self._pause_requests = 0
        self._busy = False  # a round is generating
        self._stop = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    # ---- producer ----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="miles-fully-async", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._stop or (not self._pause_requests and len(self.buffer) < self.capacity))
                    if self._stop:
                        return
                    n = min(self.round_groups, self.capacity - len(self.buffer))
                    self._busy = True
                    round_idx = self.rounds
                    self.rounds += 1
                kept, drops = self._one_round(n, round_idx)
                with self._cond:  # one critical section: paused() never sees a finished round half-added
                    self.buffer.extend(kept)
                    self.drops.update(drops)
                    self._busy = False
                    self._cond.notify_all()
        except BaseException as e:  # surfaced to the trainer by take()
            with self._cond:
                self._error = e
                self._busy = False
                self._cond.notify_all()

    def _one_round(self, n: int, round_idx: int) -> tuple[list[list[Sample]], Counter[str]]:
        pairs = _RecyclingSource(self.source, self.recycled).next_prompts(n)
        groups = [new_group(gi, p, round_idx, self.spec.n_samples_per_prompt) for gi, p in pairs]
        generate_unfinished(self.engine, groups, self.spec, (self.spec.seed * 1_000_003 + round_idx * 1009) % 2**31, self.decode)
        flat = [s for g in groups for s in g]
        for s, r in zip(flat, asyncio.run(batched_async_rm(flat, self.reward))):
            s.reward = r
        kept, drops = [], Counter()
        for g in groups:
            verdict = self.keep_filter(g, lambda s: reward_value(s.reward, self.spec.reward_key)) if self.keep_filter else None
            if verdict is not None and not verdict.keep:
                drops[verdict.reason or "filtered"] += 1
            else:
                kept.append(g)
        return kept, drops

    # ---- consumer ----------------------------------------------------------------------------------
    def take(self, n: int, rollout_id: int) -> tuple[list[list[Sample]], dict[str, float]]:
        """Block until n groups within the staleness bound are available; -> (groups, metrics)."""
        self.start()
        t0 = time.perf_counter()
        out: list[list[Sample]] = []
        stale_recycled = stale_dropped = 0
        with self._cond:
            while len(out) < n:
                self._cond.wait_for(lambda: self.buffer or self._error is not None or self._stop)
                if self._error is not None:
                    raise RuntimeError(f"fully-async rollout worker failed: {self._error!r}") from self._error
                if self._stop:
                    raise RuntimeError("fully-async rollout worker was stopped")
                group = self.buffer.popleft()
                if self.max_staleness is not None and self.staleness(group) > self.max_staleness:
                    if self.policy == "recycle":
                        self.recycled.append(_prompt_of(group))
                        stale_recycled += 1
                    else:
                        stale_dropped += 1
                    self._cond.notify_all()
                    continue
                out.append(group)
                self._cond.notify_all()
            drops, self.drops = self.drops, Counter()
            queue = len(self.buffer)
        for g in out:
            for s in g:
                s.rollout_id = rollout_id
        ages = [self.staleness(g) for g in out]
        metrics = {
            "rollout/fully_async/queue_size": float(queue),
            "rollout/fully_async/stale_groups_filtered": float(stale_recycled + stale_dropped),
            "rollout/fully_async/stale_groups_recycled": float(stale_recycled),
            "rollout/fully_async/avg_staleness": statistics.fmean(ages),
            "rollout/fully_async/max_staleness": float(max(ages)),
            "rollout/fully_async/wait_time": time.perf_counter() - t0,
        }
        metrics |= {f"rollout/dynamic_filter/drop_{k}": float(v) for k, v in drops.items()}
        return out, metrics

    def staleness(self, group: list[Sample]) -> int:
        return self.version() - min(v for s in group for v in s.weight_versions)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No generation in flight and no buffer change inside (weight sync, save, inline eval)."""
        with self._cond:
            self._pause_requests += 1
            self._cond.wait_for(lambda: not self._busy)
        try:
            yield
        finally:
            with self._cond:
                self._pause_requests -= 1
                self._cond.notify_all()

    # ---- checkpoint --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Call inside paused(): the buffer, the recycled prompts and the round counter."""
        return {
            "buffer": [[s.to_dict() for s in g] for g in self.buffer],
            "recycled": [[s.to_dict() for s in self._as_group(gi, p)] for gi, p in self.recycled],
            "rounds": self.rounds,
        }

    def load_state_dict(self, state: dict) -> None:
        with self._cond:
            self.buffer = deque([[Sample.from_dict(d) for d in g] for g in state["buffer"]])
            self.recycled = deque(_prompt_of([Sample.from_dict(d) for d in g]) for g in state["recycled"])
            self.rounds = state["rounds"]
            self._cond.notify_all()

    @staticmethod
    def _as_group(group_index: int, prompt: Prompt) -> list[Sample]:
        return [Sample(group_index=group_index, prompt=prompt.text, tokens=list(prompt.input_ids), label=prompt.label,
                       metadata=dict(prompt.metadata))]

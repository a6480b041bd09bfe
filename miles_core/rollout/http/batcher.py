"""The server's generate queue: requests wait here, one engine call at a time takes a batch.

Every engine operation (generate batches, weight updates, version changes, health probes) runs on
the server's single engine thread, so a weight update never lands in the middle of a batch: it
waits for the batch in flight, and the next batch sees the new weights.

- batching "exact": one request per engine call (results are independent of what else is queued);
  "dynamic": up to ``max_batch_size`` requests per call, after waiting ``wait_s`` for more to come.
- pause: no new batch starts; the batch in flight finishes. continue: batches start again.
- abort: queued requests finish at once with finish reason "abort" and no tokens; requests in
  flight finish at their next decode step with the tokens generated so far.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field

from miles_core.rollout.protocol import GenerateRequest, GenerateResult

from miles_core.rollout.hf_engine import HFEngine

from .metrics import GenerationCounts


@dataclass(eq=False)
class Item:
    request: GenerateRequest
    seed: int
    rid: str
    future: asyncio.Future = field(repr=False)
    aborted: bool = False  # set on the event loop, read by the engine thread between decode steps


class Batcher:
    def __init__(self, engine: HFEngine, executor: Executor, wait_s: float = 0.002):
        self.engine = engine
        self.executor = executor
        self.wait_s = wait_s
        self.pending: list[Item] = []
        self.running: list[Item] = []
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.completed = 0
        self.counts = GenerationCounts()  # tokens and requests answered (GET /metrics)
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="miles-batcher")

    async def stop(self) -> None:
        running = list(self.running)
        self.abort()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for item in running:
            if not item.future.done():
                item.future.set_exception(ConnectionAbortedError("server stopped"))

    async def submit(self, requests: list[GenerateRequest], seeds: list[int], rids: list[str]) -> list[GenerateResult]:
        loop = asyncio.get_running_loop()
        items = [Item(r, s, rid, loop.create_future()) for r, s, rid in zip(requests, seeds, rids)]
        self.pending.extend(items)
        self._wakeup.set()
        return list(await asyncio.gather(*(i.future for i in items)))

    async def run(self, fn, *args):
        """Run ``fn(*args)`` on the engine thread, after the batch in flight."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def abort(self, rid: str | None = None) -> int:
        """Abort every request (rid None) or the one with this rid. -> number aborted."""
        n = 0
        for item in list(self.pending):
            if rid is None or item.rid == rid:
                self.pending.remove(item)
                item.future.set_result(GenerateResult([], [], "abort", self.engine.weight_version, len(item.request.input_ids)))
                n += 1
        for item in self.running:
            if (rid is None or item.rid == rid) and not item.aborted:
                item.aborted = True
                n += 1
        return n

    async def _loop(self) -> None:
        take = 1 if self.engine.batching == "exact" else self.engine.max_batch_size
        while True:
            await self._wakeup.wait()
            if take > 1 and self.wait_s:
                await asyncio.sleep(self.wait_s)  # let concurrent requests join the batch
            await self.resumed.wait()
            batch, self.pending = self.pending[:take], self.pending[take:]
            if not self.pending:
                self._wakeup.clear()
            if batch:
                await self._run_batch(batch)

    async def _run_batch(self, batch: list[Item]) -> None:
        self.running = batch
        t0 = time.perf_counter()
        try:
            results = await self.run(
                self.engine.generate_seeded, [i.request for i in batch], [i.seed for i in batch], lambda k: batch[k].aborted
            )
        except Exception as e:  # the engine failed: every request of the batch gets the error
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(e)
        else:
            for item, res in zip(batch, results):
                if not item.future.done():
                    item.future.set_result(res)
            self.completed += len(batch)
            self.counts.add_batch(sum(r.prompt_tokens for r in results), sum(r.completion_tokens for r in results), len(batch),
                                  time.perf_counter() - t0)
        finally:
            self.running = []

"""EngineCalls: the generate calls a custom generate function (or the reference-style front) makes
concurrently on one event loop, batched into one engine call. Its own module: both custom.py (our
functions' context) and front.py (the reference's HTTP endpoint) use it, neither imports the other."""

from __future__ import annotations

import asyncio

from ..protocol import GenerateRequest, GenerateResult


class EngineCalls:
    """Batches the generate calls made concurrently on one event loop into one engine call (run in a
    worker thread, one at a time); each request carries its own seed."""

    def __init__(self, engine):
        self.engine = engine
        self.pending: list[tuple[GenerateRequest, int, asyncio.Future]] = []
        self._flushing = False

    async def generate(self, request: GenerateRequest, seed: int) -> GenerateResult:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((request, seed, future))
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        try:
            while self.pending:
                await asyncio.sleep(0.002)  # let the calls made in the same moment join the batch
                batch, self.pending = self.pending, []
                try:
                    results = await asyncio.to_thread(self._call, [r for r, _, _ in batch], [s for _, s, _ in batch])
                except Exception as e:
                    for _, _, f in batch:
                        f.done() or f.set_exception(e)
                    continue
                for (_, _, f), res in zip(batch, results):
                    f.done() or f.set_result(res)
        finally:
            self._flushing = False

    def _call(self, requests: list[GenerateRequest], seeds: list[int]) -> list[GenerateResult]:
        if hasattr(self.engine, "generate_seeded"):
            return self.engine.generate_seeded(requests, seeds)
        return [self.engine.generate([r], seed=s)[0] for r, s in zip(requests, seeds)]

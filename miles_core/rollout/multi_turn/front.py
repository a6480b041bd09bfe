"""An SGLang ``POST /generate`` endpoint over this run's engines, for reference-style custom generate
functions (they post to ``http://{args.sglang_router_ip}:{args.sglang_router_port}/generate``).

It serves on 127.0.0.1 (a free port) from a daemon thread while a round's custom functions run.
Bodies follow the SGLang wire format (rollout/http/wire.py): ``input_ids`` (or ``text``, tokenized
here without special tokens: a text-in function re-tokenizes, which token-in functions avoid),
``sampling_params`` (with ``sampling_seed``; without one, the front's own counter seeds it),
``return_logprob``. Calls arriving together are batched into one engine call (``EngineCalls``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future

from aiohttp import web

from miles_core.rollout.http import wire

from .calls import EngineCalls


class GenerateFront:
    def __init__(self, engine, tokenizer, host: str = "127.0.0.1"):
        self.engine, self.tokenizer, self.host = engine, tokenizer, host
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._counter = 0

    async def _generate(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            if isinstance(body, dict) and "input_ids" not in body and isinstance(body.get("text"), str):
                body = {**body, "input_ids": self.tokenizer(body["text"], add_special_tokens=False)["input_ids"]}
            requests, seeds, batched, _ = wire.parse_generate(body, len(self.tokenizer))
        except (ValueError, wire.WireError) as e:
            return web.json_response({"object": "error", "message": str(e), "code": 400}, status=400)
        t0 = time.perf_counter()
        results = await asyncio.gather(*(self._calls.generate(r, s if s is not None else self._next_seed()) for r, s in zip(requests, seeds)))
        latency = time.perf_counter() - t0
        out = [wire.result_to_json(res, wire.response_text(self.tokenizer, res.output_ids, req.params), f"front-{i}", latency,
                                   bool(body.get("return_logprob", False))) for i, (res, req) in enumerate(zip(results, requests))]
        return web.json_response(out if batched else out[0])

    def _next_seed(self) -> int:
        self._counter += 1
        return self._counter

    async def _serve(self, ready: Future) -> None:
        self._calls, self._stop = EngineCalls(self.engine), asyncio.Event()
        app = web.Application(client_max_size=2**26)
        app.router.add_post("/generate", self._generate)
        runner = web.AppRunner(app)
        try:
            await runner.setup()
            site = web.TCPSite(runner, self.host, 0)
            await site.start()
        except Exception as e:  # reported to __enter__
            ready.set_exception(e)
            return
        ready.set_result(site._server.sockets[0].getsockname()[1])
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> "GenerateFront":
        ready: Future = Future()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(ready),), name="miles-front", daemon=True)
        self._thread.start()
        self.port = ready.result(timeout=30)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)
        self._loop.close()

"""An HFEngine served over the SGLang HTTP protocol (aiohttp), for CPU runs, tests and GPU runs without SGLang.

    python -m miles_core.rollout.http.server --model-path DIR --port 0 --port-file PORT.json [--device cuda]

prints ``miles-http-server listening on http://HOST:PORT`` once it accepts requests and writes
``{"port", "url", "pid"}`` to --port-file (atomically). It is the CPU stand-in for SGLang 0.5.23: the
same routes and methods (a subset of SGLang's, held to miles_core/rollout/sglang/protocol.json by
tests/rollout/sglang/test_protocol.py), request fields, weight-update session rule, pause modes,
``/model_info`` weight version and process-group set-up (docs/engines.md has the shapes):

    POST|PUT /generate                  GET  /health_generate, /health
    POST /abort_request                 GET|POST /flush_cache
    POST /pause_generation {mode}       POST /continue_generation
    POST /begin_weight_update           POST /end_weight_update   (the session tensor / distributed updates need)
    POST /update_weights_from_disk      POST /update_weights_from_tensor   (ours: a safetensors body)
    POST /pull_weights {source_dir, local_checkpoint_dir, target_version}   (disk-delta: the route of SGLang after 0.5.23
                                        and of the reference's patched SGLang; ours: OUR_ROUTES)
    POST /init_weights_update_group     POST /update_weights_from_distributed, /destroy_weights_update_group
    POST /update_weight_version         GET|POST /get_weights_by_name      (ours: the whole tensor)
    GET|POST /weights_checker {action: snapshot|reset_tensors|compare|checksum, skip_tensor_list}
    POST /load_lora_adapter {lora_name, lora_path: a PEFT dir}   POST /unload_lora_adapter
    POST /load_lora_adapter_from_tensors (ours: base64 safetensors, wire.py; SGLang's expected_checksums)
    GET|POST /release_memory_occupation GET|POST /resume_memory_occupation
    GET  /model_info (+ /get_model_info) GET  /server_info (+ /get_server_info)  (fields: a subset; tp_size)
    POST /dumper/{configure|reset|get_state}   (SGLang's tensor dumper control: miles_core/rollout/dumper.py)
    POST /debug/fail                    (ours: rollout/sglang/protocol.py OUR_ROUTES; only with --enable-fault-injection)
    GET  /metrics                       (only with --enable-metrics, as SGLang: SGLang's metric names, rollout/http/metrics.py)

--tp-size N: the engine takes N ranks (rank_offset + tp_rank) in a weight broadcast group, as SGLang's TP
workers do (one model here: every rank receives each tensor, rank 0's copy is loaded).

API key (SGLang's ``api_key`` semantics): with --api-key (or MILES_ENGINE_API_KEY in the server's
environment, which keeps it out of the process list) every request needs ``Authorization: Bearer
<key>``, except OPTIONS and paths under /health, /ready and /metrics (probes); others get 401.
--host binds an address other than 127.0.0.1 (a node's address, so engines on other nodes are reached).

Memory: on CPU, releasing "weights" drops the parameters (empty tensors); resuming allocates them
again, uninitialized, and generate answers 503 until every parameter was written by a weight update
(colocated runs resume, then sync). On a GPU the model moves to CPU and back, contents kept.

Seeds: request i samples with ``sampling_params.sampling_seed`` when given, else
``request_seed(seed, i)`` when the body has a top-level ``seed``, else a random seed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import signal
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from aiohttp import web

from miles_core.config.rollout import API_KEY_ENV, engine_api_key  # the server's key, from its environment (launch.py sets it)
from miles_core.device import DEVICES, resolve_device
from miles_core.malloc import retain_freed_memory
from miles_core.rollout.adapters import AdapterError
from miles_core.rollout.hf_engine import WeightSessionError, outside_session
from miles_core.rollout.protocol import GenerateRequest, SamplingParams
from miles_core.rollout.weight_checker import WeightCheckError

from . import wire
from .batcher import Batcher
from .metrics import render
from miles_core.weights.delta import DeltaError

from .engine import BATCHING, HFEngine, ShardOutsideModelDir, iter_hf_weights, request_seed

log = logging.getLogger(__name__)
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")
FAULT_MODES = ("crash", "hang", "error", "none")
FAULT_TRIGGERS = ("now", "generate", "weights")  # weights: every weight update (disk, tensor, distributed) fails
FAULT_ENV = "MILES_ENGINE_FAULT_INJECTION"  # set (to anything) in a server's environment: --enable-fault-injection
OPEN_PATHS = ("/health", "/ready", "/metrics")  # no key needed, as in SGLang (probes)
PAUSE_MODES = ("abort", "retract", "in_place")  # SGLang's PauseGenerationReqInput.mode; "abort" is its default


@dataclass(frozen=True)
class ServerOptions:
    model_path: str | None = None  # reported by /get_model_info
    enable_fault_injection: bool = False  # serve POST /debug/fail
    enable_metrics: bool = False  # serve GET /metrics (SGLang's --enable-metrics; rollout/http/metrics.py)
    batch_wait_s: float = 0.002  # dynamic batching: wait this long for more requests
    health_timeout_s: float = 20.0  # /health_generate: a decode step (busy) or a probe (idle) within this
    exit_on_crash: bool = False  # fault "crash": exit the process (True) or drop every connection (a thread server)
    max_body_bytes: int = 2**31 - 1  # the largest request body (a weight bucket)
    api_key: str | None = None  # every request but OPEN_PATHS needs "Authorization: Bearer <api_key>"
    tp_size: int = 1  # ranks this engine takes in a weight broadcast group (rank_offset + tp_rank)
    weights_cpu_backup: bool = False  # SGLang's --enable-weights-cpu-backup: a release keeps the weights in host memory


@dataclass(frozen=True)
class Fault:
    mode: str  # crash | hang | error
    on: str  # now: every endpoint but /debug/fail; generate: when a /generate request arrives; weights: weight updates
    after: int = 0  # on generate: let this many /generate calls through first


def _error(status: int, message: str) -> web.Response:
    body = {"object": "error", "success": False, "message": message, "code": status}
    return web.json_response(body, status=status)


class EngineServer:
    """The HTTP front of one engine. start()/stop() on the event loop that serves it."""

    def __init__(self, engine: HFEngine, options: ServerOptions = ServerOptions()):
        self.engine = engine
        self.options = options
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="miles-engine")
        self.released: set[str] = set()
        self.fault: Fault | None = None
        self.crashed = False
        self.stats = {"requests_total": 0, "generate_calls": 0, "weight_buckets": 0, "weight_tensors": 0}
        self.events: list[str] = []  # control calls in order (pause, flush, release, resume, weights, version): /get_server_info
        self.weight_groups: dict[str, tuple[str, list]] = {}  # group name -> (backend, one group per TP rank)
        self.group_ranks: dict[str, list[int]] = {}  # group name -> this engine's ranks in it (rank_offset + tp_rank)
        self.received: dict[int, int] = {}  # group rank -> tensors it received by broadcast (every TP rank: all of them)
        self._dropped: dict[str, tuple] = {}  # released CPU parameters: name -> (shape, dtype)
        self._backup: dict[str, torch.Tensor] = {}  # released CPU parameters kept (weights_cpu_backup): name -> data
        self._stale: set[int] = set()  # ids of parameters allocated by a resume and not written since
        self.batcher: Batcher | None = None
        self.runner: web.AppRunner | None = None
        self._stopping: asyncio.Event | None = None
        self._home_device = None  # where released weights return to

    # ---- lifecycle --------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.options.max_body_bytes, middlewares=[self._middleware])
        for methods, path, handler in self.routes():
            for method in methods:
                app.router.add_route(method, path, handler)
        if self.options.enable_fault_injection:
            app.router.add_post("/debug/fail", self.debug_fail)
        if self.options.enable_metrics:  # SGLang mounts prometheus_client's app there (add_prometheus_middleware)
            app.router.add_get("/metrics", self.metrics)
        return app

    def routes(self) -> list[tuple[tuple[str, ...], str, object]]:
        """(methods, path, handler) of every SGLang route served (methods as SGLang's http_server.py declares them)."""
        get, post, both = ("GET",), ("POST",), ("GET", "POST")
        return [
            (("POST", "PUT"), "/generate", self.generate), (get, "/health_generate", self.health_generate),
            (get, "/health", self.health_generate), (post, "/abort_request", self.abort_request),
            (both, "/flush_cache", self.flush_cache), (post, "/pause_generation", self.pause_generation),
            (post, "/continue_generation", self.continue_generation),
            (post, "/begin_weight_update", self.begin_weight_update), (post, "/end_weight_update", self.end_weight_update),
            (post, "/update_weights_from_disk", self.update_weights_from_disk),
            (post, "/update_weights_from_tensor", self.update_weights_from_tensor),
            (post, "/pull_weights", self.pull_weights),
            (post, "/update_weight_version", self.update_weight_version),
            (post, "/init_weights_update_group", self.init_weights_update_group),
            (post, "/destroy_weights_update_group", self.destroy_weights_update_group),
            (post, "/update_weights_from_distributed", self.update_weights_from_distributed),
            (both, "/get_weights_by_name", self.get_weights_by_name), (both, "/weights_checker", self.weights_checker),
            (post, "/load_lora_adapter", self.load_lora_adapter),
            (post, "/load_lora_adapter_from_tensors", self.load_lora_adapter_from_tensors),
            (post, "/unload_lora_adapter", self.unload_lora_adapter),
            (both, "/release_memory_occupation", self.release_memory_occupation),
            (both, "/resume_memory_occupation", self.resume_memory_occupation),
            (get, "/model_info", self.model_info), (get, "/get_model_info", self.model_info),
            (get, "/server_info", self.server_info), (get, "/get_server_info", self.server_info),
            (post, "/dumper/{method}", self.dumper_control),
        ]

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Bind and serve; -> the bound port."""
        self._stopping = asyncio.Event()
        self.batcher = Batcher(self.engine, self.executor, self.options.batch_wait_s)
        self.batcher.start()
        self.runner = web.AppRunner(self.app(), shutdown_timeout=1.0, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, host, port).start()
        if not self.options.api_key:
            log.warning("engine server on %s:%s has no API key: any local process can update its weights or pause it; "
                        "pass --api-key (or set %s) to require one", host, self.runner.addresses[0][1], API_KEY_ENV)
        return self.runner.addresses[0][1]

    async def stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()  # releases hung handlers
        if self.batcher is not None:
            await self.batcher.stop()
        if self.runner is not None:
            await self.runner.cleanup()
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def _crash(self) -> None:
        """Die (subprocess) or look dead (thread): stop listening and drop every connection."""
        if self.options.exit_on_crash:
            sys.stdout.flush()
            os._exit(70)
        self.crashed = True
        for site in list(self.runner.sites):
            await site.stop()
        for conn in list(self.runner.server.connections):
            if conn.transport is not None:
                conn.transport.abort()
        self.batcher.abort()

    async def _hang(self) -> web.Response:
        await self._stopping.wait()
        return _error(503, "server stopped")

    def _authorized(self, request: web.Request) -> bool:
        """SGLang's rule: no key configured, OPTIONS, or a probe path; else a matching bearer token."""
        key = self.options.api_key
        if not key or request.method == "OPTIONS" or request.path.startswith(OPEN_PATHS):
            return True
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(token.encode(), key.encode())

    @web.middleware
    async def _middleware(self, request: web.Request, handler) -> web.StreamResponse:
        if not self._authorized(request):
            return _error(401, "Unauthorized: this engine needs the run's API key (Authorization: Bearer <key>)")
        if self.crashed:
            if request.transport is not None:
                request.transport.abort()
            return _error(503, "crashed")
        fault = self.fault
        if fault is not None and fault.on == "now" and request.path != "/debug/fail":
            if fault.mode == "hang":
                return await self._hang()
            return _error(500, "injected fault (error)")
        try:
            return await handler(request)
        except (wire.WireError, WeightSessionError, AdapterError) as e:
            return _error(400, str(e))
        except web.HTTPException:
            raise
        except Exception as e:
            log.exception("%s %s failed", request.method, request.path)
            return _error(500, f"{type(e).__name__}: {e}")

    # ---- generation ---------------------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.Response:
        if self.released or self._stale:
            return _error(503, self._not_ready())
        body = await _json(request)
        vocab = self.engine.model.get_input_embeddings().num_embeddings
        requests, seeds, batched, top_seed = wire.parse_generate(body, vocab)
        unknown = sorted({r.lora_path for r in requests if r.lora_path is not None} - self.engine.adapters.loaded)
        if unknown:
            raise AdapterError(f"lora_path {unknown}: no such LoRA adapter loaded (loaded: {sorted(self.engine.adapters.loaded)})")
        seeds = [s if s is not None else request_seed(top_seed, i) if top_seed is not None else secrets.randbits(62)
                 for i, s in enumerate(seeds)]
        rid = body.get("rid")
        if isinstance(rid, list):
            rids = [str(r) for r in rid]
        elif rid and not batched:
            rids = [str(rid)]
        else:
            rids = [f"{rid}-{i}" if rid else uuid.uuid4().hex for i in range(len(requests))]
        if len(rids) != len(requests):
            raise wire.WireError(f"{len(requests)} input_ids but {len(rids)} rids")
        scoring = wire.parse_input_logprobs(body, requests, vocab)  # prefill-only scoring (OPD teachers), or None
        self.stats["requests_total"] += len(requests)
        self.stats["generate_calls"] += 1
        if self.fault is not None and self.fault.on == "generate" and self.stats["generate_calls"] > self.fault.after:
            if self.fault.mode == "crash":
                await self._crash()
                return _error(503, "crashed")
            if self.fault.mode == "hang":
                return await self._hang()
            return _error(500, "injected fault (error)")
        if scoring is not None:
            fields = await self.batcher.run(self._score_inputs, requests, scoring)
            version = self.engine.get_weight_version()
            out = [wire.prefill_to_json(req, r, f, version) for req, r, f in zip(requests, rids, fields)]
            return web.json_response(out if batched else out[0])
        t0 = time.perf_counter()
        results = await self.batcher.submit(requests, seeds, rids)
        latency = time.perf_counter() - t0
        tok = self.engine.tokenizer
        return_logprob = bool(body.get("return_logprob", False))
        out = [wire.result_to_json(res, wire.response_text(tok, res.output_ids, req.params), r, latency, return_logprob)
               for res, req, r in zip(results, requests, rids)]
        return web.json_response(out if batched else out[0])

    def _score_inputs(self, requests: list[GenerateRequest], scoring: list[wire.InputLogprobs]) -> list[dict]:
        """SGLang's input log-prob fields of each prefill-only request (models/scoring.py input_logprobs)."""
        from miles_core.models.scoring import input_logprobs

        return [input_logprobs(self.engine.model, r.input_ids, o.start, o.top_k, list(o.token_ids))
                for r, o in zip(requests, scoring)]

    async def health_generate(self, request: web.Request) -> web.Response:
        """200 when the engine generates: a decode step within the timeout (busy), or a 1-token probe (idle)."""
        if self.released or self._stale:
            return _error(503, self._not_ready())
        if not self.batcher.resumed.is_set():  # SGLang's probe is a generate request: it waits while paused
            try:
                await asyncio.wait_for(self.batcher.resumed.wait(), self.options.health_timeout_s)
            except asyncio.TimeoutError:
                return _error(503, f"generation paused for more than {self.options.health_timeout_s}s (no /continue_generation)")
        if self.batcher.running:
            before, deadline = self.engine.progress, time.monotonic() + self.options.health_timeout_s
            while self.engine.progress == before and self.batcher.running and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            ok = self.engine.progress != before or not self.batcher.running
            return web.Response(status=200) if ok else _error(503, f"no decode step in {self.options.health_timeout_s}s")
        probe = GenerateRequest([self.engine.tokenizer.eos_token_id], SamplingParams(max_new_tokens=1))
        try:
            await asyncio.wait_for(self.batcher.run(self.engine.generate_seeded, [probe], [0]), self.options.health_timeout_s)
        except asyncio.TimeoutError:
            return _error(503, f"health probe took more than {self.options.health_timeout_s}s")
        return web.Response(status=200)

    def _not_ready(self) -> str:
        if self.released:
            return f"memory released {sorted(self.released)}; call /resume_memory_occupation first"
        return f"{len(self._stale)} parameters not written since /resume_memory_occupation; update the weights first"

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await _json(request, default={})
        n = self.batcher.abort(None if body.get("abort_all") else body.get("rid") or "")
        return web.json_response({"success": True, "num_aborted": n})

    async def flush_cache(self, request: web.Request) -> web.Response:
        self.events.append("flush_cache")
        return web.Response(text="Cache flushed.\n")  # no prefix cache is kept between requests

    async def pause_generation(self, request: web.Request) -> web.Response:
        """mode "abort" (SGLang's default): queued and in-flight requests end with finish reason abort.
        "retract" / "in_place": the batch in flight finishes, queued requests wait (what SGLang's retract
        recomputes after /continue_generation, this engine's seeded requests produce the same way)."""
        body = await _json(request, default={})
        mode = body.get("mode", "abort")
        if mode not in PAUSE_MODES:
            raise wire.WireError(f"pause_generation mode {mode!r}: expected one of {PAUSE_MODES}")
        self.batcher.resumed.clear()
        self.events.append(f"pause:{mode}")
        if mode == "abort":
            self.batcher.abort()
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        self.batcher.resumed.set()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    # ---- weights --------------------------------------------------------------------------------
    async def begin_weight_update(self, request: web.Request) -> web.Response:
        self.engine.begin_weight_update()
        self.events.append("begin_weight_update")
        return web.json_response({"success": True, "message": "Success"})

    async def end_weight_update(self, request: web.Request) -> web.Response:
        self.engine.end_weight_update()
        self.events.append("end_weight_update")
        return web.json_response({"success": True, "message": "Success"})

    def _require_session(self, route: str) -> None:
        """SGLang refuses a tensor / distributed update outside a session before it reads or receives anything."""
        if not self.engine.in_weight_session:
            raise WeightSessionError(outside_session(route))

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await _json(request)
        if not body.get("model_path"):
            raise wire.WireError("update_weights_from_disk needs model_path")
        if body.get("abort_all_requests"):
            self.batcher.abort()
        try:
            named = await self.batcher.run(lambda: dict(iter_hf_weights(body["model_path"])))
            await self._apply(named, self.engine.load_weights)
        except (FileNotFoundError, ShardOutsideModelDir) as e:  # 400 naming the path
            raise wire.WireError(str(e)) from e
        if body.get("weight_version") is not None:
            await self.batcher.run(self.engine.set_weight_version, wire.parse_version(body["weight_version"]))
        msg = f"Loaded {len(named)} tensors from {body['model_path']}."
        return web.json_response({"success": True, "message": msg, "num_paused_requests": 0})

    async def pull_weights(self, request: web.Request) -> web.Response:
        """disk-delta: the local checkpoint brought to target_version (weights/delta.py pull), off the generate thread:
        the weights served change only with the /update_weights_from_disk of it that follows. A delta that fails its
        checksums answers 400 and writes nothing."""
        body = await _json(request)
        missing = [k for k in ("source_dir", "local_checkpoint_dir", "target_version") if body.get(k) in (None, "")]
        if missing:
            raise wire.WireError(f"pull_weights needs {', '.join(missing)}")
        if self.fault is not None and self.fault.on == "weights":
            raise RuntimeError(f"injected fault ({self.fault.mode}) on a weight update")
        try:
            version = await asyncio.to_thread(self.engine.pull_weights, body["source_dir"], body["local_checkpoint_dir"],
                                              wire.parse_version(body["target_version"]))
        except (DeltaError, FileNotFoundError) as e:
            raise wire.WireError(str(e)) from e
        self.events.append("pull_weights")
        return web.json_response({"success": True, "message": f"{body['local_checkpoint_dir']} holds version {version}"})

    async def update_weights_from_tensor(self, request: web.Request) -> web.Response:
        self._require_session("update_weights_from_tensor")
        if request.content_type != wire.BUCKET_CONTENT_TYPE:
            raise wire.WireError(
                "this server takes a weight bucket as a safetensors body (Content-Type application/octet-stream); "
                "SGLang's serialized_named_tensors (in-process IPC handles) cannot cross HTTP"
            )
        named = wire.decode_bucket(await request.read())
        await self._apply(named, self.engine.update_weights_from_tensor)
        if "weight_version" in request.query:
            await self.batcher.run(self.engine.set_weight_version, wire.parse_version(request.query["weight_version"]))
        self.stats["weight_buckets"] += 1
        self.stats["weight_tensors"] += len(named)
        return web.json_response({"success": True, "message": f"Updated {len(named)} tensors."})

    async def _apply(self, named: dict, load) -> None:
        """Check every name and shape first (nothing is applied if one is wrong), then ``load`` them (an engine method)."""
        if self.fault is not None and self.fault.on == "weights":
            raise RuntimeError(f"injected fault ({self.fault.mode}) on a weight update")
        params = self.engine.model.state_dict(keep_vars=True)
        for name, t in named.items():
            if name not in params:
                raise wire.WireError(f"engine has no parameter {name!r}")
            if tuple(t.shape) != tuple(params[name].shape):
                raise wire.WireError(f"{name}: shape {tuple(t.shape)} != engine's {tuple(params[name].shape)}")
        await self.batcher.run(load, list(named.items()))
        self._stale -= {id(params[name]) for name in named}
        self.events.append(f"weights:{len(named)}")

    async def load_lora_adapter_from_tensors(self, request: web.Request) -> web.Response:
        """SGLang's adapter load (no weight-update session); the body as wire.parse_adapter reads it."""
        load = wire.parse_adapter(await _json(request))
        await self.batcher.run(self.engine.load_lora_adapter_from_tensors, load.lora_name, load.config_dict,
                               list(load.tensors.items()), load.expected_checksums)
        self.events.append(f"lora:{load.lora_name}:{len(load.tensors)}")
        return web.json_response({"success": True, "loaded_adapters": {n: n for n in sorted(self.engine.adapters.loaded)}})

    async def load_lora_adapter(self, request: web.Request) -> web.Response:
        """SGLang's /load_lora_adapter: the engine reads the PEFT dir at lora_path (a missing or partial dir: 400)."""
        name, path = wire.parse_adapter_path(await _json(request))
        await self.batcher.run(self.engine.load_lora_adapter, name, path)
        self.events.append(f"lora:{name}:{path}")
        return web.json_response({"success": True, "loaded_adapters": {n: n for n in sorted(self.engine.adapters.loaded)}})

    async def unload_lora_adapter(self, request: web.Request) -> web.Response:
        body = await _json(request)
        if not isinstance(body.get("lora_name"), str):
            raise wire.WireError("unload_lora_adapter needs lora_name")
        await self.batcher.run(self.engine.unload_lora_adapter, body["lora_name"])
        return web.json_response({"success": True, "loaded_adapters": {n: n for n in sorted(self.engine.adapters.loaded)}})

    async def update_weight_version(self, request: web.Request) -> web.Response:
        body = await _json(request)
        raw = body.get("new_version")
        if raw is None:
            raise wire.WireError("update_weight_version needs new_version")
        if body.get("abort_all_requests", True):  # SGLang's default: True
            self.batcher.abort()
        version = wire.parse_version(raw)
        await self.batcher.run(self.engine.set_weight_version, version)
        self.events.append(f"version:{version}")
        msg = f"Weight version updated to {version}"
        return web.json_response({"success": True, "message": msg, "new_version": str(version)})

    async def init_weights_update_group(self, request: web.Request) -> web.Response:
        """Each of the engine's TP ranks joins the sender's group as rank ``rank_offset + tp_rank`` (SGLang's rule),
        on the store keys SGLang's init_custom_process_group uses; answers once every rank joined."""
        body = await _json(request)
        missing = [k for k in ("master_address", "master_port", "rank_offset", "world_size") if k not in body]
        if missing:
            raise wire.WireError(f"init_weights_update_group needs {missing}")
        name, backend = body.get("group_name", "weight_update_group"), body.get("backend", "nccl")
        offset, world, tp = int(body["rank_offset"]), int(body["world_size"]), self.options.tp_size
        if offset < 1 or offset + tp > world:
            raise wire.WireError(f"rank_offset {offset} + tp_size {tp} does not fit world_size {world} (rank 0 is the sender)")
        join = _group_joiner(backend, tp)
        address = _tcp(body["master_address"], int(body["master_port"]))
        groups = await asyncio.gather(*(asyncio.to_thread(join, address, world, offset + r, name) for r in range(tp)))
        self.weight_groups[name] = (backend, list(groups))
        self.group_ranks[name] = [offset + r for r in range(tp)]
        self.events.append(f"group:{name}:{offset}+{tp}/{world}")
        return web.json_response({"success": True, "message": "Succeeded to initialize custom process group."})

    async def destroy_weights_update_group(self, request: web.Request) -> web.Response:
        from miles_core.weights.broadcast import destroy_group

        name = (await _json(request, default={})).get("group_name", "weight_update_group")
        if name not in self.weight_groups:
            raise wire.WireError("The group to be destroyed does not exist.")
        backend, groups = self.weight_groups.pop(name)
        self.group_ranks.pop(name, None)
        if backend == "nccl":  # made by init_custom_process_group: registered in this process
            destroy_group(groups[0])
        return web.json_response({"success": True, "message": "Succeeded to destroy custom process group."})

    async def update_weights_from_distributed(self, request: web.Request) -> web.Response:
        """Every TP rank receives every tensor named in the body, whole, from rank 0 of the group (SGLang's layout: each
        rank's loader then takes its shard); the ranks' copies must agree, tp rank 0's is loaded."""
        from miles_core.weights.broadcast import receive

        self._require_session("update_weights_from_distributed")
        body = await _json(request)
        name = body.get("group_name", "weight_update_group")
        if name not in self.weight_groups:
            raise wire.WireError(f"Group {name} not in {list(self.weight_groups)}. Please call `init_weights_update_group` first.")
        backend, groups = self.weight_groups[name]
        device = "cuda" if backend == "nccl" else "cpu"
        meta = (body["names"], body["dtypes"], body["shapes"])
        received = await asyncio.gather(*(asyncio.to_thread(receive, g, *meta, device) for g in groups))
        named = dict(received[0])
        for rank, got in zip(self.group_ranks[name], received):
            differs = [n for n, t in got if not torch.equal(t, named[n])]
            if differs:
                raise RuntimeError(f"group rank {rank} received {differs[:3]} unlike tp rank 0")
            self.received[rank] = self.received.get(rank, 0) + len(got)
        await self._apply(named, self.engine.update_weights_from_tensor)
        if body.get("weight_version") is not None:
            await self.batcher.run(self.engine.set_weight_version, wire.parse_version(body["weight_version"]))
        self.stats["weight_buckets"] += 1
        self.stats["weight_tensors"] += len(named)
        return web.json_response({"success": True, "message": "Succeeded to update parameter online."})

    async def get_weights_by_name(self, request: web.Request) -> web.Response:
        body = await _json(request)
        params = self.engine.model.state_dict()
        if body.get("name") not in params:
            raise wire.WireError(f"engine has no parameter {body.get('name')!r}")
        return web.json_response(params[body["name"]].float().cpu().tolist())

    async def weights_checker(self, request: web.Request) -> web.Response:
        """SGLang's CheckWeightsReqInput {action, skip_tensor_list, selector, allow_quant_error} (rollout/weight_checker.py);
        a failed compare answers 400 with the differing names."""
        body = await _json(request, default={})
        try:
            message = await self.batcher.run(self.engine.check_weights, body.get("action"), body.get("skip_tensor_list"),
                                             bool(body.get("allow_quant_error")), body.get("selector") or "all")
        except (WeightCheckError, ValueError) as e:
            return _error(400, str(e))
        if isinstance(message, dict):  # checksum: SGLang's ChecksumInfo, per rank (this server holds one copy)
            return web.json_response({"success": True, "message": f"checksums of {len(message['checksums'])} tensors",
                                      "ranks": [message]})
        return web.json_response({"success": True, "message": message})

    async def dumper_control(self, request: web.Request) -> web.Response:
        """SGLang's dumper control (configure, reset, get_state) -> one result per rank; a bad method or key answers 400."""
        body = await _json(request, default={})
        try:
            result = await self.batcher.run(self.engine.dumper_control, request.match_info["method"], body)
        except (ValueError, TypeError) as e:
            return _error(400, str(e))
        return web.json_response(result)

    async def release_memory_occupation(self, request: web.Request) -> web.Response:
        """Marks the tags released (generate answers 503 until resumed); weights: a CUDA model moves to
        CPU, a CPU model's parameters are dropped, or with weights_cpu_backup kept aside and put back by the resume
        (SGLang's --enable-weights-cpu-backup: torch_memory_saver's CPU backup of the weights region)."""
        tags = await _tags(request)
        if "weights" in tags and "weights" not in self.released:
            await self.batcher.run(self._release_weights)
        self.released |= tags
        self.events.append("release:" + ",".join(sorted(tags)))
        return web.json_response({"success": True, "released": sorted(self.released)})

    async def resume_memory_occupation(self, request: web.Request) -> web.Response:
        tags = await _tags(request)
        if "weights" in tags and "weights" in self.released:
            await self.batcher.run(self._resume_weights)
        self.released -= tags
        self.events.append("resume:" + ",".join(sorted(tags)))
        return web.json_response({"success": True, "released": sorted(self.released)})

    def _release_weights(self) -> None:
        model = self.engine.model
        self._home_device = next(model.parameters()).device
        if self._home_device.type != "cpu":
            model.to("cpu")
            return
        for name, p in model.named_parameters():
            self._dropped[name] = (tuple(p.shape), p.dtype)
            if self.options.weights_cpu_backup:
                self._backup[name] = p.data
            p.data = torch.empty(0, dtype=p.dtype)

    def _resume_weights(self) -> None:
        model = self.engine.model
        if not self._dropped:
            model.to(self._home_device or "cpu")
            return
        for name, p in model.named_parameters():
            shape, dtype = self._dropped[name]
            if name in self._backup:  # the weights as released: nothing to rewrite
                p.data = self._backup.pop(name)
                continue
            p.data = torch.empty(shape, dtype=dtype)
            self._stale.add(id(p))
        self._dropped = {}

    # ---- info and faults ------------------------------------------------------------------------
    async def model_info(self, request: web.Request) -> web.Response:
        """SGLang's /model_info fields this engine has; ``weight_version`` is where a client reads the served version."""
        return web.json_response({"model_path": self.options.model_path, "is_generation": True,
                                  "weight_version": str(self.engine.weight_version)})

    async def server_info(self, request: web.Request) -> web.Response:
        b = self.batcher
        return web.json_response({
            "server": wire.SERVER_NAME, "model_path": self.options.model_path, "tp_size": self.options.tp_size,
            "weight_version": str(self.engine.weight_version), "in_weight_session": self.engine.in_weight_session,
            "batching": self.engine.batching, "max_batch_size": self.engine.max_batch_size,
            "paused": not b.resumed.is_set(), "released": sorted(self.released),
            "fault_injection": self.options.enable_fault_injection, "fault": None if self.fault is None else self.fault.__dict__,
            "stats": {**self.stats, "requests_completed": b.completed, "running": len(b.running), "queued": len(b.pending)},
            "events": self.events[-100:],
        })

    async def metrics(self, request: web.Request) -> web.Response:
        b = self.batcher
        body = render(self.options.model_path or "default", len(b.running), len(b.pending), b.counts)
        return web.Response(body=body, content_type="text/plain", charset="utf-8")  # prometheus_client's text format 0.0.4

    async def debug_fail(self, request: web.Request) -> web.Response:
        body = await _json(request)
        mode, on, after = body.get("mode"), body.get("on", "now"), body.get("after", 0)
        if mode not in FAULT_MODES or on not in FAULT_TRIGGERS or not isinstance(after, int) or after < 0:
            raise wire.WireError(f"debug/fail needs mode in {FAULT_MODES}, on in {FAULT_TRIGGERS} and after >= 0 (an int)")
        self.fault = None if mode == "none" else Fault(mode, on, after + self.stats["generate_calls"])
        if mode == "crash" and on == "now":
            asyncio.get_running_loop().call_later(0.05, lambda: asyncio.ensure_future(self._crash()))
        return web.json_response({"success": True, "fault": body})


def _tcp(host: str, port: int) -> str:
    from miles_core.weights.broadcast import tcp_address

    return tcp_address(host, port)


def _group_joiner(backend: str, tp_size: int):
    """How one TP rank joins: gloo ranks on SGLang's keys built by hand (several ranks share this process; torch
    registers a group name once per process); one NCCL rank through init_custom_process_group itself."""
    from miles_core.weights.broadcast import init_custom_process_group, member_group

    if backend == "gloo":
        return member_group
    if backend == "nccl" and tp_size == 1:
        return lambda address, world, rank, name: init_custom_process_group("nccl", address, world, rank, name)
    raise wire.WireError(f"backend {backend!r} with tp_size {tp_size}: this server joins gloo groups, or nccl with tp_size 1")


async def _json(request: web.Request, default: dict | None = None) -> dict:
    if not request.can_read_body:
        if default is not None:
            return default
        raise wire.WireError(f"{request.path} needs a JSON body")
    try:
        body = await request.json()
    except json.JSONDecodeError as e:
        raise wire.WireError(f"{request.path}: body is not JSON ({e})") from e
    if body is None and default is not None:
        return default
    if not isinstance(body, dict):
        raise wire.WireError(f"{request.path}: body must be a JSON object")
    return body


async def _tags(request: web.Request) -> set[str]:
    tags = (await _json(request, default={})).get("tags") or list(MEMORY_TAGS)
    bad = set(tags) - set(MEMORY_TAGS)
    if bad:
        raise wire.WireError(f"unknown memory tags {sorted(bad)}; valid: {list(MEMORY_TAGS)}")
    return set(tags)


# ---- command line ---------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m miles_core.rollout.http.server", description=__doc__.split("\n")[0])
    p.add_argument("--model-path", required=True, help="HF dir, builtin://<name> or hub id")
    p.add_argument("--host", default="127.0.0.1", help="address to bind: 127.0.0.1 (this machine only) or the node's address")
    p.add_argument("--port", type=int, default=0, help="0 = any free port (see --port-file)")
    p.add_argument("--port-file", type=Path, help="write {port, url, pid} here once listening")
    p.add_argument("--batching", choices=BATCHING, default="exact")
    p.add_argument("--max-batch-size", type=int, default=256)
    p.add_argument("--tp-size", type=int, default=1, help="ranks this engine takes in a weight broadcast group (SGLang's TP)")
    p.add_argument("--batch-wait-ms", type=float, default=2.0)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", choices=DEVICES, default="cpu", help="where the model runs (miles_core/device.py): cpu, cuda "
                   "(this process's current CUDA device) or auto")
    p.add_argument("--num-threads", type=int, default=0, help="torch intra-op threads (0 = torch default)")
    p.add_argument("--weight-version", type=int, default=0)
    p.add_argument("--health-timeout", type=float, default=20.0)
    p.add_argument("--api-key", default=engine_api_key(),
                   help=f"require Authorization: Bearer <key> (default: ${API_KEY_ENV}; prefer the env var, argv is public)")
    p.add_argument("--enable-weights-cpu-backup", action="store_true",
                   help="a release of the weights keeps them in host memory and the resume puts them back (SGLang's flag)")
    p.add_argument("--enable-metrics", action="store_true", help="serve GET /metrics: SGLang's metric names (SGLang's flag)")
    p.add_argument("--enable-fault-injection", action="store_true", default=bool(os.environ.get(FAULT_ENV)),
                   help=f"serve POST /debug/fail (tests only; also on when {FAULT_ENV} is set)")
    return p.parse_args(argv)


async def _serve(engine: HFEngine, args: argparse.Namespace, model_path: str) -> None:
    options = ServerOptions(model_path=model_path, enable_fault_injection=args.enable_fault_injection, enable_metrics=args.enable_metrics,
                            batch_wait_s=args.batch_wait_ms / 1000, health_timeout_s=args.health_timeout,
                            exit_on_crash=True, api_key=args.api_key, tp_size=args.tp_size,
                            weights_cpu_backup=args.enable_weights_cpu_backup)
    server = EngineServer(engine, options)
    port = await server.start(args.host, args.port)
    url = f"http://{args.host}:{port}"
    if args.port_file:
        tmp = args.port_file.with_name(args.port_file.name + ".tmp")
        tmp.write_text(json.dumps({"port": port, "url": url, "pid": os.getpid()}))
        os.replace(tmp, args.port_file)
    print(f"miles-http-server listening on {url}", flush=True)
    done = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, done.set)
    await done.wait()
    await server.stop()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from miles_core.env import cache_dir, configure_library_environment

    configure_library_environment()
    import torch

    from miles_core.models import resolve_model_path

    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    if resolve_device(args.device).type == "cpu":
        retain_freed_memory()  # miles_core/malloc.py
    path = resolve_model_path(args.model_path, cache_dir())
    engine = HFEngine.from_pretrained(path, args.dtype, args.device, batching=args.batching, max_batch_size=args.max_batch_size)
    engine.set_weight_version(args.weight_version)
    asyncio.run(_serve(engine, args, str(path)))


if __name__ == "__main__":
    main()

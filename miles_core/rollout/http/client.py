"""HTTPEngineClient: the RolloutEngine protocol over the SGLang HTTP API.

The same code talks to a real SGLang server and to ours (server.py). It uses only SGLang 0.5.23's
routes and request fields (held to the snapshot of the wheel, miles_core/rollout/sglang/protocol.json,
by tests/rollout/sglang/test_protocol.py): generate, health, abort, pause/continue, flush, weights
from disk / distributed, weight-update sessions (``begin_weight_update`` / ``end_weight_update``),
``/update_weight_version``, the weight version from ``GET /model_info``, the TP size from
``GET /server_info``, memory. ``update_weights_from_tensor`` posts safetensors buckets, which only our
server takes (SGLang's body carries in-process IPC handles): against SGLang it fails with a message
that says to use ``update_weights_from_disk``.

Seeds: ``generate(requests, seed)`` gives request i ``sampling_params.sampling_seed =
request_seed(seed, i)``, so a result depends on its own seed only, never on the batch it is in
(see engine.py). SGLang honours sampling_seed when started with deterministic inference.

API key: ``api_key`` is sent as ``Authorization: Bearer <key>`` on every call (SGLang's --api-key;
our server's --api-key / MILES_ENGINE_API_KEY); a server that wants one answers 401 without it.

Errors name the URL: ``EngineUnreachable`` (refused, reset, timed out: the router fails over)
and ``EngineHTTPError`` (an answer with status >= 400: ``.status``, the body's message).
Transport errors are retried ``max_retries`` times with exponential backoff (every call is
idempotent: generate carries its seeds); a read timeout is not retried.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

import httpx
import torch

from miles_core.rollout.hf_engine import SeededGenerate
from miles_core.rollout.protocol import GenerateRequest, GenerateResult
from miles_core.weights.sync import iter_buckets

from . import wire

DEFAULT_BUCKET_BYTES = 512 * 2**20  # update_weight_buffer_size's default


class EngineError(RuntimeError):
    """A call to an engine server failed; ``url`` names the engine, ``status`` the HTTP status if any."""

    def __init__(self, url: str, message: str, status: int | None = None):
        super().__init__(f"{url}: {message}")
        self.url, self.status = url, status


class EngineUnreachable(EngineError, ConnectionError):
    """No answer: connection refused or reset, or a timeout."""


class EngineHTTPError(EngineError):
    """The engine answered with an error status."""


class HTTPEngineClient(SeededGenerate):
    def __init__(self, base_url: str, *, timeout_s: float = 600.0, connect_timeout_s: float = 5.0,
                 health_timeout_s: float = 5.0, max_retries: int = 3, backoff_s: float = 0.2,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, api_key: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key  # a restarted engine's new client takes the same key
        self.health_timeout_s = health_timeout_s
        self.max_retries, self.backoff_s = max_retries, backoff_s
        self.bucket_bytes = bucket_bytes
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None  # SGLang's api_key (and ours)
        self._http = httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s), headers=headers)
        self._version: int | None = None  # last version set or read: used when a response carries none
        self._tp_size: int | None = None  # from GET /server_info, read once

    def __repr__(self) -> str:
        return f"HTTPEngineClient({self.base_url!r})"

    # ---- transport ------------------------------------------------------------------------------
    def request(self, method: str, path: str, *, retries: int | None = None, timeout: float | None = None, **kwargs) -> httpx.Response:
        """One call with retries on transport errors. -> the response (status < 400)."""
        url = self.base_url + path
        attempts = 1 + (self.max_retries if retries is None else retries)
        extra = {} if timeout is None else {"timeout": httpx.Timeout(timeout, connect=min(timeout, 5.0))}
        for attempt in range(attempts):
            try:
                resp = self._http.request(method, path, **kwargs, **extra)
                break
            except httpx.ReadTimeout as e:
                raise EngineUnreachable(url, f"no answer within the read timeout ({e!r})") from e
            except httpx.TransportError as e:
                if attempt + 1 == attempts:
                    raise EngineUnreachable(url, f"{type(e).__name__}: {e} (after {attempts} attempts)") from e
                time.sleep(self.backoff_s * 2**attempt)
        if resp.status_code >= 400:
            raise EngineHTTPError(url, f"HTTP {resp.status_code}: {_message(resp)}", resp.status_code)
        return resp

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "HTTPEngineClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- generation -------------------------------------------------------------------------------
    def generate_seeded(self, requests: list[GenerateRequest], seeds: list[int]) -> list[GenerateResult]:
        """One batched POST /generate; request i samples with seeds[i]."""
        if len(seeds) != len(requests):
            raise ValueError(f"{len(requests)} requests but {len(seeds)} seeds")
        if not requests:
            return []
        data = self.request("POST", "/generate", json=wire.generate_body(requests, seeds)).json()
        if not isinstance(data, list) or len(data) != len(requests):
            raise EngineError(self.base_url + "/generate", f"expected a list of {len(requests)} results")
        try:
            return [wire.result_from_json(d, len(r.input_ids), self._version or 0) for d, r in zip(data, requests)]
        except (wire.WireError, KeyError, TypeError, IndexError) as e:
            raise EngineError(self.base_url + "/generate", f"malformed response: {e}") from e

    def abort(self, rid: str | None = None) -> None:
        """Abort every request (rid None) or one: they finish with finish reason "abort"."""
        self.request("POST", "/abort_request", json={"abort_all": True} if rid is None else {"rid": rid})

    # ---- control --------------------------------------------------------------------------------
    def health(self) -> bool:
        """GET /health_generate answers 200 within ``health_timeout_s``; never raises."""
        try:
            self.request("GET", "/health_generate", retries=0, timeout=self.health_timeout_s)
        except EngineError:
            return False
        return True

    def pause_generation(self, mode: str = "abort") -> None:
        """SGLang's modes: abort (its default: requests in flight end with finish reason abort), retract, in_place."""
        self.request("POST", "/pause_generation", json={"mode": mode})

    def continue_generation(self) -> None:
        self.request("POST", "/continue_generation", json={})

    def flush_cache(self) -> None:
        self.request("GET", "/flush_cache")

    def check_weights(self, action: str, skip_list: list[str] | None = None, allow_quant_error: bool = False,
                      selector: str = "all") -> str:
        """SGLang's /weights_checker (snapshot | reset_tensors | compare); a failed compare raises EngineHTTPError."""
        payload = {"action": action, "allow_quant_error": allow_quant_error, "selector": selector}
        if skip_list is not None:
            payload["skip_tensor_list"] = list(skip_list)  # SGLang's name for the reference's skip list
        return str(self.request("POST", "/weights_checker", json=payload).json().get("message", ""))

    def weight_checksums(self) -> list[dict[str, str]]:
        """[{tensor name: digest}] of this engine: /weights_checker {action: checksum}, its ranks merged (weight_checker.py)."""
        from miles_core.rollout.weight_checker import merge_ranks

        body = self.request("POST", "/weights_checker", json={"action": "checksum"}).json()
        if not body.get("success") or not body.get("ranks"):
            raise EngineHTTPError(self.base_url + "/weights_checker", f"checksum answered no ranks: {str(body)[:200]}")
        return [merge_ranks(body["ranks"])]

    def dumper_control(self, method: str, body: dict) -> list[dict]:
        """SGLang's /dumper/{method} (configure, reset, get_state; served by SGLang with DUMPER_SERVER_PORT=reuse, and
        by ours): one result per rank."""
        return self.request("POST", f"/dumper/{method}", json=body).json()

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.request("POST", "/release_memory_occupation", json={"tags": tags} if tags else {})

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.request("POST", "/resume_memory_occupation", json={"tags": tags} if tags else {})

    def server_info(self) -> dict[str, Any]:
        """GET /server_info (both servers have it: SGLang's resolved server args, ours its own fields)."""
        return self.request("GET", "/server_info").json()

    def is_miles_server(self) -> bool:
        return self.server_info().get("server") == wire.SERVER_NAME

    def tp_size(self) -> int:
        """The engine's tensor-parallel size: its ranks in a weight broadcast group are rank_offset + tp_rank."""
        if self._tp_size is None:
            self._tp_size = int(self.server_info().get("tp_size") or 1)
        return self._tp_size

    # ---- weights --------------------------------------------------------------------------------
    def set_weight_version(self, version: int) -> None:
        self.request("POST", "/update_weight_version", json={"new_version": str(version)})
        self._version = version

    def get_weight_version(self) -> int:
        """The version the engine serves: ``weight_version`` of GET /model_info (SGLang has no /get_weight_version)."""
        self._version = wire.parse_version(self.request("GET", "/model_info").json().get("weight_version"))
        return self._version

    def begin_weight_update(self) -> None:
        """Open SGLang's weight-update session: tensor and distributed updates are refused outside one."""
        self.request("POST", "/begin_weight_update", retries=0, json={})

    def end_weight_update(self) -> None:
        self.request("POST", "/end_weight_update", retries=0, json={})

    def update_weights_from_disk(self, model_path: str, weight_version: int | None = None) -> None:
        """SGLang's /update_weights_from_disk: the server loads the HF dir (a path it can read)."""
        body: dict[str, Any] = {"model_path": str(model_path)}
        if weight_version is not None:
            body["weight_version"] = str(weight_version)
        self.request("POST", "/update_weights_from_disk", json=body)
        if weight_version is not None:
            self._version = weight_version

    def pull_weights(self, source_dir: str, local_checkpoint_dir: str, target_version: int) -> None:
        """disk-delta's /pull_weights (the reference's SGLangEngine.pull_weights body): the server brings its local
        checkpoint to ``target_version`` (verified); the weights it serves change with the disk reload that follows."""
        self.request("POST", "/pull_weights", json={"local_checkpoint_dir": str(local_checkpoint_dir),
                                                    "source_dir": str(source_dir), "target_version": int(target_version)})

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int,
                                  group_name: str, backend: str = "gloo") -> None:
        """SGLang's /init_weights_update_group: the engine's TP ranks join the sender's group as ranks
        ``rank_offset + tp_rank`` (returns once all joined)."""
        self.request("POST", "/init_weights_update_group", retries=0, json={
            "master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend})

    def destroy_weights_update_group(self, group_name: str) -> None:
        self.request("POST", "/destroy_weights_update_group", retries=0, json={"group_name": group_name})

    def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]], group_name: str,
                                        weight_version: int | None = None) -> None:
        """SGLang's /update_weights_from_distributed: metadata here, the tensors over the group (sent by rank 0)."""
        body: dict[str, Any] = {"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group_name, "flush_cache": False}
        if weight_version is not None:
            body["weight_version"] = str(weight_version)
        self.request("POST", "/update_weights_from_distributed", retries=0, json=body)

    def load_lora_adapter_from_tensors(self, lora_name: str, config_dict: dict,
                                       named_tensors: Iterable[tuple[str, torch.Tensor]],
                                       expected_checksums: dict[str, str] | None = None) -> None:
        """SGLang's /load_lora_adapter_from_tensors (ours: load_format safetensors, wire.adapter_body), one copy per TP rank;
        ``expected_checksums``: SGLang's field, the engine refuses an adapter that does not hash to it."""
        self.post_adapter(wire.adapter_body(lora_name, config_dict, list(named_tensors), self.tp_size(), expected_checksums))

    def post_adapter(self, body: dict) -> None:
        try:
            self.request("POST", "/load_lora_adapter_from_tensors", retries=0, json=body)
        except EngineHTTPError as e:
            if e.status in (400, 422) and not self.is_miles_server():
                raise EngineHTTPError(self.base_url, "adapters as safetensors over HTTP are a miles-server payload (SGLang's "
                                      "are in-process IPC handles); for SGLang sync the adapter by disk (update_weight_mode "
                                      "disk: /load_lora_adapter)", e.status) from e
            raise

    def load_lora_adapter(self, lora_name: str, lora_path: str) -> None:
        """SGLang's /load_lora_adapter: the engine reads the PEFT adapter dir ``lora_path`` (a path it sees)."""
        self.request("POST", "/load_lora_adapter", retries=0, json={"lora_name": lora_name, "lora_path": lora_path})

    def unload_lora_adapter(self, lora_name: str) -> None:
        self.request("POST", "/unload_lora_adapter", retries=0, json={"lora_name": lora_name})

    def _unload_if_loaded(self, lora_name: str) -> None:
        """Unload ``lora_name`` where loaded (an engine without it answers 400: ignored, as the reference does in
        update_weight_from_tensor.py ``_send_to_colocated_engine``)."""
        try:
            self.unload_lora_adapter(lora_name)
        except EngineHTTPError as e:
            if e.status != 400:
                raise

    def reload_lora_adapter(self, lora_name: str, config_dict: dict, named_tensors: Iterable[tuple[str, torch.Tensor]],
                            expected_checksums: dict[str, str] | None = None) -> None:
        """Unload ``lora_name`` where loaded, then load these tensors under it."""
        self._unload_if_loaded(lora_name)
        self.load_lora_adapter_from_tensors(lora_name, config_dict, named_tensors, expected_checksums)

    def reload_lora_adapter_from_path(self, lora_name: str, lora_path: str) -> None:
        """Unload ``lora_name`` where loaded, then load the PEFT dir ``lora_path`` under it (/load_lora_adapter)."""
        self._unload_if_loaded(lora_name)
        self.load_lora_adapter(lora_name, lora_path)

    def get_weights_by_name(self, name: str) -> torch.Tensor:
        """SGLang's /get_weights_by_name (ours returns the whole tensor as nested lists)."""
        return torch.tensor(self.request("POST", "/get_weights_by_name", json={"name": name}).json())

    def update_weights_from_tensor(self, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int | None = None) -> int:
        """POST the tensors in buckets of at most ``bucket_bytes`` (ours only). -> number of buckets."""
        n = 0
        for bucket in iter_buckets(named_tensors, bucket_bytes or self.bucket_bytes):
            self.post_weight_bucket(wire.encode_bucket(bucket))
            n += 1
        return n

    def post_weight_bucket(self, payload: bytes) -> None:
        """One safetensors-encoded bucket (wire.encode_bucket) -> POST /update_weights_from_tensor."""
        try:
            self.request("POST", "/update_weights_from_tensor", content=Chunks(payload),
                         headers={"Content-Type": wire.BUCKET_CONTENT_TYPE, "Content-Length": str(len(payload))})
        except EngineHTTPError as e:
            if e.status in (400, 415, 422) and not self.is_miles_server():
                raise EngineHTTPError(self.base_url, "weights over HTTP (safetensors buckets) are a miles-server "
                                      "endpoint; for SGLang use update_weights_from_disk", e.status) from e
            raise


class Chunks:
    """A large body as 1 MiB pieces, re-iterable (a retry sends it again). httpx's sync transport sends a
    bytes body with ``sock.send`` + ``buf = buf[n:]``, a copy of the rest per send: 400 MB took ~25 s on
    loopback; in pieces it takes about as long as the memcpy."""

    SIZE = 2**20

    def __init__(self, payload: bytes):
        self.payload = memoryview(payload)

    def __iter__(self):
        for i in range(0, len(self.payload), self.SIZE):
            yield bytes(self.payload[i : i + self.SIZE])


def _message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:500]
    if isinstance(body, dict):
        return str(body.get("message") or body.get("error") or body)[:500]
    return str(body)[:500]

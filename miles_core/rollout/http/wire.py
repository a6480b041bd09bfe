"""The SGLang wire format, in one place for the client and the server.

POST /generate body (SGLang native API; ``seed`` at the top level is ours)::

    {"input_ids": [[int, ...], ...] | [int, ...],
     "sampling_params": {...} | [{...}, ...],   # one dict shared by all, or one per request
     "return_logprob": true, "seed": int?}
    sampling_params: temperature, top_p, top_k (-1 = off), max_new_tokens, stop, stop_token_ids,
                     sampling_seed (SGLang's name; the per-request seed), skip_special_tokens (the text only)

Prefill-only scoring (what OPD teachers are asked, the reference's on_policy_distillation._score_payload):
``sampling_params.max_new_tokens`` 0 (temperature 0 allowed: nothing is sampled), ``return_logprob`` and
``logprob_start_len`` >= 0, optionally ``top_logprobs_num`` (int) and ``token_ids_logprob`` ([int] shared, or one list
per request); the response has no output tokens and meta_info gains SGLang's ``input_token_logprobs``
(``[[logprob | null, id, null], ...]``, null for token 0), ``input_top_logprobs`` and ``input_token_ids_logprobs``
(per input token ``null`` or ``[[logprob, id, null], ...]``): parse_input_logprobs, models/scoring.py input_logprobs.

Response: one object per request (a list when ``input_ids`` is a list of lists)::

    {"text": str, "output_ids": [int, ...],
     "meta_info": {"id": str, "finish_reason": {"type": "stop"|"length"|"abort", ...},
                   "prompt_tokens": int, "completion_tokens": int, "cached_tokens": 0,
                   "weight_version": "<int as a string>", "e2e_latency": float,
                   "output_token_logprobs": [[logprob, token_id, null], ...]}}

``lora_path`` (SGLang's GenerateReqInput.lora_path): one adapter name or None per request, present only when a request
names one.

LoRA adapters, POST /load_lora_adapter_from_tensors (SGLang's LoadLoRAAdapterFromTensorsReqInput)::

    {"lora_name": str, "config_dict": {adapter_config.json}, "load_format": "safetensors",
     "serialized_named_tensors": [base64 of a safetensors file, one per TP rank],
     "expected_checksums": {tensor name: sha256 hex}?}       # check_lora_weight_equal: refused on any difference

POST /load_lora_adapter (SGLang's LoadLoRAAdapterReqInput): ``{"lora_name": str, "lora_path": str, "pinned": bool?}``,
``lora_path`` a PEFT adapter dir (adapter_config.json, adapter_model.safetensors) the engine reads itself.

SGLang's serialized_named_tensors are MultiprocessingSerializer payloads (ForkingPickler: CUDA IPC handles or
shared-memory names of the sender's process, load_format None or "flattened_bucket"): they cannot cross HTTP and
unpickling them from a socket would run whatever they hold, so our server takes ``load_format: "safetensors"``
only, the tensors named as in adapter_model.safetensors; anything else is answered 400.

Weight buckets (ours only): the body of POST /update_weights_from_tensor is a safetensors file
(``Content-Type: application/octet-stream``), tensor name -> tensor, at most one bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from miles_core.rollout.protocol import GenerateRequest, GenerateResult, SamplingParams

SERVER_NAME = "miles-hf"  # "server" in our GET /get_server_info: how a client tells our server from SGLang
FINISH_REASONS = ("stop", "length", "abort")
BUCKET_CONTENT_TYPE = "application/octet-stream"

# SGLang sampling params this engine does not implement: accepted only at their neutral value.
NEUTRAL_PARAMS: dict[str, Any] = {
    "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
    "min_p": 0.0, "ignore_eos": False, "n": 1,
}
# SGLang params that only shape the returned text: accepted and ignored.
TEXT_ONLY_PARAMS = frozenset({"spaces_between_special_tokens", "no_stop_trim"})
KNOWN_PARAMS = frozenset({"temperature", "top_p", "top_k", "max_new_tokens", "stop", "stop_token_ids", "sampling_seed",
                          "skip_special_tokens", "min_new_tokens"})


class WireError(ValueError):
    """A request or response that does not follow the format (the server answers 400)."""


# ---- requests ---------------------------------------------------------------------------------
def params_to_json(params: SamplingParams, seed: int | None) -> dict[str, Any]:
    body = {
        "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
        "max_new_tokens": params.max_new_tokens, "stop": list(params.stop), "stop_token_ids": list(params.stop_token_ids),
        "skip_special_tokens": params.skip_special_tokens,
    }
    if params.min_new_tokens:  # sent only when set: a default body stays what it was
        body["min_new_tokens"] = params.min_new_tokens
    if seed is not None:
        body["sampling_seed"] = seed
    return body


def generate_body(requests: list[GenerateRequest], seeds: list[int]) -> dict[str, Any]:
    """A batch /generate body: one sampling_params dict per request, each with its sampling_seed (and lora_path)."""
    body = {
        "input_ids": [list(r.input_ids) for r in requests],
        "sampling_params": [params_to_json(r.params, s) for r, s in zip(requests, seeds)],
        "return_logprob": True,
    }
    if any(r.lora_path is not None for r in requests):
        body["lora_path"] = [r.lora_path for r in requests]
    return body


def params_from_json(d: dict[str, Any]) -> tuple[SamplingParams, int | None]:
    """SGLang sampling_params -> (SamplingParams, sampling_seed or None). Raises WireError."""
    if not isinstance(d, dict):
        raise WireError(f"sampling_params must be an object, got {type(d).__name__}")
    for key, value in d.items():
        if key in NEUTRAL_PARAMS and value != NEUTRAL_PARAMS[key]:
            raise WireError(f"sampling_params.{key}={value!r} is not supported by this engine (only {NEUTRAL_PARAMS[key]!r})")
        if key not in KNOWN_PARAMS and key not in NEUTRAL_PARAMS and key not in TEXT_ONLY_PARAMS:
            raise WireError(f"unknown sampling_params key {key!r}; known: {sorted(KNOWN_PARAMS)}")
    try:
        stop = d.get("stop") or ()
        params = SamplingParams(
            temperature=float(d.get("temperature", 1.0)), top_p=float(d.get("top_p", 1.0)),
            top_k=int(d.get("top_k", -1)), max_new_tokens=int(d.get("max_new_tokens", 128)),
            stop_token_ids=tuple(int(t) for t in d.get("stop_token_ids") or ()),
            stop=(stop,) if isinstance(stop, str) else tuple(str(s) for s in stop),
            skip_special_tokens=bool(d.get("skip_special_tokens", True)),
            min_new_tokens=int(d.get("min_new_tokens") or 0),
        )
        seed = d.get("sampling_seed")
        seed = None if seed is None else int(seed)
    except (TypeError, ValueError) as e:
        raise WireError(f"bad sampling_params {d}: {e}") from e
    if params.temperature <= 0 and params.max_new_tokens > 0:  # 0 is SGLang's greedy; a prefill-only request samples nothing
        raise WireError(f"temperature={params.temperature}: must be > 0 (greedy decoding is not implemented by the HF engine)")
    if not 0 < params.top_p <= 1 or params.max_new_tokens < 0:
        raise WireError(f"bad sampling_params {d}: need 0 < top_p <= 1 and max_new_tokens >= 0")
    if not 0 <= params.min_new_tokens <= params.max_new_tokens:  # SGLang's SamplingParams.verify rule
        raise WireError(f"min_new_tokens must be in [0, max_new_tokens({params.max_new_tokens})], got {params.min_new_tokens}")
    return params, seed


def parse_generate(body: Any, vocab_size: int) -> tuple[list[GenerateRequest], list[int | None], bool, int | None]:
    """A /generate body -> (requests, per-request seed or None, batched?, top-level seed)."""
    if not isinstance(body, dict) or "input_ids" not in body:
        raise WireError("/generate needs a JSON object with input_ids (text input is not supported)")
    ids = body["input_ids"]
    if not isinstance(ids, list):
        raise WireError("input_ids must be a list of token ids or a list of such lists")
    batched = bool(ids) and isinstance(ids[0], list)
    rows = ids if batched else [ids]
    sp = body.get("sampling_params") or {}
    sps = sp if isinstance(sp, list) else [sp] * len(rows)
    if len(sps) != len(rows):
        raise WireError(f"{len(rows)} input_ids but {len(sps)} sampling_params")
    lora = body.get("lora_path")
    loras = lora if isinstance(lora, list) else [lora] * len(rows)
    if len(loras) != len(rows) or not all(x is None or isinstance(x, str) for x in loras):
        raise WireError(f"lora_path must be an adapter name, null, or one of those per request ({len(rows)} input_ids)")
    requests, seeds = [], []
    for row, d, lora_path in zip(rows, sps, loras):
        if not row or not all(isinstance(t, int) and 0 <= t < vocab_size for t in row):
            raise WireError(f"input_ids must be non-empty lists of token ids in [0, {vocab_size})")
        params, seed = params_from_json(d)
        requests.append(GenerateRequest(list(row), params, lora_path=lora_path))
        seeds.append(seed)
    top = body.get("seed")
    return requests, seeds, batched, None if top is None else int(top)


@dataclass(frozen=True)
class InputLogprobs:
    """What a prefill-only request asks for (SGLang's GenerateReqInput): input log-probs from token ``start`` on
    (logprob_start_len), the ``top_k`` most likely tokens of each position (top_logprobs_num) and the log-probs of
    ``token_ids`` at each position (token_ids_logprob)."""

    start: int
    top_k: int = 0
    token_ids: tuple[int, ...] = ()


def _per_request(value: Any, n: int, name: str, nested: bool = False) -> list:
    """A GenerateReqInput field given once for all requests or as one value per request."""
    if value is None:
        return [None] * n
    per = value if isinstance(value, list) and (not nested or (value and isinstance(value[0], list))) else None
    if per is None:
        return [value] * n
    if len(per) != n:
        raise WireError(f"{n} input_ids but {len(per)} {name}")
    return per


def parse_input_logprobs(body: dict[str, Any], requests: list[GenerateRequest], vocab_size: int) -> list[InputLogprobs] | None:
    """The prefill-only scoring a /generate body asks for (logprob_start_len >= 0 with return_logprob), one per
    request, or None. This server scores input tokens only for prefill-only requests (max_new_tokens 0, the
    reference's teacher scoring) and returns top / token-id log-probs of input positions only: anything else that
    asks for them is a WireError, never a response without them."""
    n = len(requests)
    starts = _per_request(body.get("logprob_start_len"), n, "logprob_start_len")
    tops = _per_request(body.get("top_logprobs_num"), n, "top_logprobs_num")
    ids = _per_request(body.get("token_ids_logprob"), n, "token_ids_logprob", nested=True)
    asked = any(s is not None and int(s) >= 0 for s in starts) and bool(body.get("return_logprob"))
    extra = any(t for t in tops) or any(i for i in ids)
    if not asked:
        if extra:
            raise WireError("top_logprobs_num / token_ids_logprob: this server returns them for prefill-only requests only "
                            "(max_new_tokens 0, return_logprob, logprob_start_len >= 0), not output_top_logprobs")
        return None
    if any(r.params.max_new_tokens != 0 for r in requests) or any(r.lora_path is not None for r in requests):
        raise WireError("logprob_start_len: this server returns input log-probs of prefill-only requests only "
                        "(every sampling_params.max_new_tokens 0, no lora_path)")
    out = []
    for r, s, t, i in zip(requests, starts, tops, ids):
        s, t, i = int(s if s is not None else 0), int(t or 0), tuple(int(x) for x in (i or ()))
        if not 0 <= s < len(r.input_ids) or t < 0 or not all(0 <= x < vocab_size for x in i):
            raise WireError(f"bad input log-probs request: logprob_start_len {s} (input of {len(r.input_ids)} tokens), "
                            f"top_logprobs_num {t}, token_ids_logprob in [0, {vocab_size})")
        out.append(InputLogprobs(start=s, top_k=t, token_ids=i))
    return out


def prefill_to_json(req: GenerateRequest, rid: str, fields: dict[str, list], weight_version: int) -> dict[str, Any]:
    """The response to a prefill-only request (SGLang's shape: no text, no output tokens, finish_reason length 0)."""
    meta = {"id": rid, "finish_reason": {"type": "length", "length": 0}, "prompt_tokens": len(req.input_ids),
            "completion_tokens": 0, "cached_tokens": 0, "weight_version": str(weight_version), "e2e_latency": 0.0,
            "output_token_logprobs": [], **fields}
    return {"text": "", "output_ids": [], "meta_info": meta}


# ---- responses --------------------------------------------------------------------------------
def response_text(tokenizer, ids: list[int], params: SamplingParams) -> str:
    """SGLang's ``text`` of a response: a final stop token (EOS or one of stop_token_ids: the one that ended it) is
    trimmed (SGLang 0.5.23 managers/detokenizer_manager.py trim_matched_stop, no_stop_trim off), the rest decoded with
    ``params.skip_special_tokens``. The token ids themselves are never changed."""
    stops = set(params.stop_token_ids) | {tokenizer.eos_token_id}
    if ids and ids[-1] in stops:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)


def result_to_json(res: GenerateResult, text: str, rid: str, latency: float, return_logprob: bool) -> dict[str, Any]:
    finish: dict[str, Any] = {"type": res.finish_reason}
    if res.finish_reason == "length":
        finish["length"] = res.completion_tokens
    elif res.finish_reason == "stop" and res.output_ids:
        finish["matched"] = res.output_ids[-1]
    elif res.finish_reason == "abort":
        finish["message"] = "aborted by /abort_request"
    meta = {
        "id": rid, "finish_reason": finish, "prompt_tokens": res.prompt_tokens,
        "completion_tokens": res.completion_tokens, "cached_tokens": 0,
        "weight_version": str(res.weight_version), "e2e_latency": latency,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(res.output_log_probs, res.output_ids)]
    return {"text": text, "output_ids": list(res.output_ids), "meta_info": meta}


def parse_version(value: Any) -> int:
    """SGLang weight versions are strings; ours are ints. SGLang's initial "default" -> 0."""
    if value is None or value == "default":
        return 0
    try:
        return int(value)
    except (TypeError, ValueError) as e:
        raise WireError(f"weight_version {value!r} is not an integer") from e


def result_from_json(d: dict[str, Any], prompt_len: int, default_version: int = 0) -> GenerateResult:
    """One SGLang /generate response object -> GenerateResult (token ids from output_token_logprobs;
    ``default_version`` when meta_info has no weight_version, as in older SGLang)."""
    meta = d.get("meta_info") or {}
    entries = meta.get("output_token_logprobs")
    if entries is None:
        raise WireError("response has no meta_info.output_token_logprobs (was return_logprob sent?)")
    finish = meta.get("finish_reason") or {}
    reason = finish.get("type") if isinstance(finish, dict) else finish
    if reason not in FINISH_REASONS:
        raise WireError(f"unknown finish_reason {finish!r}; expected type in {FINISH_REASONS}")
    ids = [int(e[1]) for e in entries]  # not output_ids: SGLang may trim the matched stop token there
    return GenerateResult(
        output_ids=ids, output_log_probs=[float(e[0]) for e in entries], finish_reason=reason,
        weight_version=default_version if meta.get("weight_version") is None else parse_version(meta["weight_version"]),
        prompt_tokens=int(meta.get("prompt_tokens", prompt_len)),
    )


# ---- weight buckets ---------------------------------------------------------------------------
def encode_bucket(named_tensors: list[tuple[str, torch.Tensor]]) -> bytes:
    """A bucket -> safetensors bytes. Tensors sharing memory (tied weights) are copied apart."""
    from safetensors.torch import save

    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in named_tensors:
        if name in tensors:
            raise ValueError(f"tensor {name!r} appears twice in one bucket")
        t = t.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        tensors[name] = t.clone() if (t.numel() and ptr in seen) else t
        seen.add(ptr)
    return save(tensors)


def decode_bucket(payload: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    try:
        return load(payload)
    except Exception as e:  # safetensors raises its own error types
        raise WireError(f"body is not a safetensors file: {e}") from e


# ---- LoRA adapters ----------------------------------------------------------------------------
ADAPTER_FORMAT = "safetensors"  # our load_format of /load_lora_adapter_from_tensors (module docstring)


def adapter_body(lora_name: str, config_dict: dict, named_tensors: list[tuple[str, torch.Tensor]], tp_size: int = 1,
                 expected_checksums: dict[str, str] | None = None) -> dict:
    """A /load_lora_adapter_from_tensors body: the adapter as base64 safetensors, one copy per TP rank; with
    ``expected_checksums`` (check_lora_weight_equal) SGLang's field of the same name, {tensor name: sha256 hex}."""
    import base64

    payload = base64.b64encode(encode_bucket(named_tensors)).decode("ascii")
    body = {"lora_name": lora_name, "config_dict": config_dict, "load_format": ADAPTER_FORMAT,
            "serialized_named_tensors": [payload] * tp_size}
    if expected_checksums is not None:
        body["expected_checksums"] = expected_checksums
    return body


@dataclass(frozen=True)
class AdapterLoad:
    """A parsed /load_lora_adapter_from_tensors body: this TP rank's tensors; ``expected_checksums`` or None."""

    lora_name: str
    config_dict: dict
    tensors: dict[str, torch.Tensor]
    expected_checksums: dict[str, str] | None = None


def parse_adapter(body: Any, tp_rank: int = 0) -> AdapterLoad:
    """A /load_lora_adapter_from_tensors body -> AdapterLoad. Raises WireError."""
    import base64
    import binascii

    if not isinstance(body, dict) or not isinstance(body.get("lora_name"), str) or not isinstance(body.get("config_dict"), dict):
        raise WireError("/load_lora_adapter_from_tensors needs lora_name (a string) and config_dict (adapter_config.json)")
    if body.get("load_format") != ADAPTER_FORMAT:
        raise WireError(f"load_format {body.get('load_format')!r}: this server takes load_format {ADAPTER_FORMAT!r} (base64 "
                        "safetensors per TP rank); SGLang's MultiprocessingSerializer payloads hold in-process handles and "
                        "are not unpickled from HTTP")
    parts = body.get("serialized_named_tensors")
    if not isinstance(parts, list) or len(parts) <= tp_rank or not isinstance(parts[tp_rank], str):
        raise WireError(f"serialized_named_tensors must be a list with a base64 string for TP rank {tp_rank}")
    sums = body.get("expected_checksums")
    if sums is not None and not (isinstance(sums, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in sums.items())):
        raise WireError("expected_checksums must be an object of tensor name -> sha256 hex string (or null)")
    try:
        raw = base64.b64decode(parts[tp_rank], validate=True)
    except (binascii.Error, ValueError) as e:
        raise WireError(f"serialized_named_tensors[{tp_rank}] is not base64: {e}") from e
    return AdapterLoad(body["lora_name"], body["config_dict"], decode_bucket(raw), sums)


def parse_adapter_path(body: Any) -> tuple[str, str]:
    """A /load_lora_adapter body (SGLang's LoadLoRAAdapterReqInput: lora_name, lora_path, pinned) -> (name, path)."""
    if not isinstance(body, dict) or not isinstance(body.get("lora_name"), str) or not isinstance(body.get("lora_path"), str):
        raise WireError("/load_lora_adapter needs lora_name and lora_path (strings: the adapter's name, its PEFT dir)")
    if not isinstance(body.get("pinned", False), bool):
        raise WireError("/load_lora_adapter: pinned must be a boolean")
    return body["lora_name"], body["lora_path"]

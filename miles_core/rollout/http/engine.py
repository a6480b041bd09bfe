"""Per-request seeded generation: a result depends only on (weights, request, the request's seed).

``HFEngine.generate(requests, seed)`` draws every row from one generator, so a request's sample
depends on its position in the batch and on the other requests in it. Behind a router a batch is
split across engines, so that would make the result depend on the routing. Here each request i of
``generate(requests, seed)`` has its own ``torch.Generator`` seeded with ``request_seed(seed, i)``;
``generate_seeded(requests, seeds)`` takes the seeds explicitly (the router derives them from the
global index, then sends sub-batches anywhere).

Sampling is by inverse CDF: request i draws its ``max_new_tokens`` uniforms u[i, t] (float64) from
its generator up front; at step t its token is the first index whose cumulative probability
(float64 cumsum of the filtered softmax) exceeds u[i, t] * total. One vectorized searchsorted per
step, so per-request generators cost nothing per step (a multinomial call per row per step made
the batched path ~30% slower on the tiny model).

Seeds are necessary, not sufficient: float32 CPU kernels round differently with the batch shape
(a GEMM with 2 rows vs 16 rows differs in the last bits, ~1e-6 on the logits), so two batchings
of the same requests give the same tokens except at near-ties, and log-probs equal to ~1e-5.
``batching`` chooses:
  exact    every request is generated alone (a batch of one): results are bit-identical whatever
           the batch, the engine or the arrival order.
  dynamic  requests with the same (temperature, top_k, top_p) are batched (chunks of at most
           ``max_batch_size``): ~10x the throughput of exact on CPU.

Also added (the server needs them): ``aborted(i)``, polled every decode step, finishes row i
with finish reason "abort" and the tokens generated so far; ``progress`` counts decode steps
(a liveness heartbeat for /health_generate). Intended to move into HFEngine (see docs/engines.md).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable, Iterator, Literal

import torch

from miles_core.rollout.hf_engine import HFEngine, filter_logits
from miles_core.rollout.protocol import GenerateRequest, GenerateResult

Batching = Literal["exact", "dynamic"]
BATCHING: tuple[str, ...] = ("exact", "dynamic")
SEED_MODULUS = 2**62


def request_seed(seed: int, index: int) -> int:
    """Seed of request ``index`` of a ``generate(requests, seed)`` call: blake2b("seed:index") mod 2^62."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % SEED_MODULUS


def sampling_key(request: GenerateRequest) -> tuple[float, int, float]:
    """Requests sharing this key may share a decode batch (the logit filters are per batch)."""
    p = request.params
    return (p.temperature, p.top_k, p.top_p)


class SeededHFEngine(HFEngine):
    """HFEngine with one generator per request, a batching policy, abort polling and a heartbeat."""

    def __init__(self, model, tokenizer, max_batch_size: int = 256, batching: Batching = "exact"):
        if batching not in BATCHING:
            raise ValueError(f"batching={batching!r}: expected one of {BATCHING}")
        super().__init__(model, tokenizer, max_batch_size)
        self.batching = batching
        self.progress = 0  # decode steps run so far (read by the server's health check)

    def generate(self, requests: list[GenerateRequest], seed: int) -> list[GenerateResult]:
        return self.generate_seeded(requests, [request_seed(seed, i) for i in range(len(requests))])

    def generate_seeded(
        self, requests: list[GenerateRequest], seeds: list[int], aborted: Callable[[int], bool] | None = None
    ) -> list[GenerateResult]:
        """Request i samples from ``torch.Generator().manual_seed(seeds[i])``; ``aborted(i)`` ends it."""
        if len(seeds) != len(requests):
            raise ValueError(f"{len(requests)} requests but {len(seeds)} seeds")
        self._running.wait()
        results: list[GenerateResult | None] = [None] * len(requests)
        for batch in self.plan_batches(requests):
            gens = [torch.Generator().manual_seed(seeds[i]) for i in batch]
            row_aborted = (lambda row: aborted(batch[row])) if aborted else (lambda row: False)
            for i, res in zip(batch, self._generate_rows([requests[i] for i in batch], gens, row_aborted)):
                results[i] = res
        return results  # type: ignore[return-value]

    def plan_batches(self, requests: list[GenerateRequest]) -> list[list[int]]:
        """Indices of the requests that share each decode batch, in order."""
        if self.batching == "exact":
            return [[i] for i in range(len(requests))]
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(sampling_key(r), []).append(i)
        size = self.max_batch_size
        return [idx[s : s + size] for idx in groups.values() for s in range(0, len(idx), size)]

    @torch.no_grad()
    def _generate_rows(
        self, requests: list[GenerateRequest], gens: list[torch.Generator], aborted: Callable[[int], bool]
    ) -> list[GenerateResult]:
        """HFEngine._generate_batch with per-row uniforms (inverse-CDF sampling) and abort polling."""
        params = requests[0].params
        if any(sampling_key(r) != sampling_key(requests[0]) for r in requests):
            raise ValueError("one decode batch must share temperature, top_k and top_p")
        device = next(self.model.parameters()).device
        B = len(requests)
        width = max(len(r.input_ids) for r in requests)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((B, width), pad, dtype=torch.long)  # [B, P] left-padded
        attn = torch.zeros((B, width), dtype=torch.long)
        for i, r in enumerate(requests):
            ids[i, width - len(r.input_ids) :] = torch.tensor(r.input_ids)
            attn[i, width - len(r.input_ids) :] = 1
        ids, attn = ids.to(device), attn.to(device)
        stops = [set(r.params.stop_token_ids) | {self.tokenizer.eos_token_id} for r in requests]
        steps = max(r.params.max_new_tokens for r in requests)
        u = torch.zeros((B, steps), dtype=torch.float64)  # [B, T] row i's uniforms, from its generator only
        for i, r in enumerate(requests):
            u[i, : r.params.max_new_tokens] = torch.rand(r.params.max_new_tokens, generator=gens[i], dtype=torch.float64)
        out_ids: list[list[int]] = [[] for _ in range(B)]
        out_lp: list[list[float]] = [[] for _ in range(B)]
        reason = ["length"] * B
        done = [False] * B
        self._mark_aborted(aborted, done, reason)
        past, step_input = None, ids
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # [B, P]
        for step in range(steps):
            if all(done):
                break
            out = self.model(input_ids=step_input, attention_mask=attn, position_ids=pos, past_key_values=past, use_cache=True)
            past = out.past_key_values
            last = out.logits[:, -1, :].float() / params.temperature  # [B, V]
            logp = torch.log_softmax(last, dim=-1)
            cdf = torch.softmax(filter_logits(last, params.top_k, params.top_p), dim=-1).cpu().double().cumsum(-1)  # [B, V]
            nxt = torch.searchsorted(cdf, u[:, step : step + 1] * cdf[:, -1:], right=True).squeeze(-1)  # [B]
            nxt = nxt.clamp(max=cdf.shape[-1] - 1).masked_fill(torch.tensor(done), pad)  # finished rows are fed pad
            tok_lp = logp.gather(-1, nxt.to(device)[:, None]).squeeze(-1).cpu()  # [B]
            for i in range(B):
                if done[i]:
                    continue
                t = int(nxt[i])
                out_ids[i].append(t)
                out_lp[i].append(float(tok_lp[i]))
                if t in stops[i] or self._hit_stop_string(out_ids[i], requests[i].params):
                    done[i], reason[i] = True, "stop"
                elif len(out_ids[i]) >= requests[i].params.max_new_tokens:
                    done[i] = True
            self.progress += 1
            self._mark_aborted(aborted, done, reason)
            step_input = nxt.to(device)[:, None]
            attn = torch.cat([attn, torch.ones((B, 1), dtype=attn.dtype, device=device)], dim=1)
            pos = pos[:, -1:] + 1
        return [
            GenerateResult(out_ids[i], out_lp[i], reason[i], self.weight_version, prompt_tokens=len(r.input_ids))
            for i, r in enumerate(requests)
        ]

    @staticmethod
    def _mark_aborted(aborted: Callable[[int], bool], done: list[bool], reason: list[str]) -> None:
        for i in range(len(done)):
            if not done[i] and aborted(i):
                done[i], reason[i] = True, "abort"


# ---- loading ----------------------------------------------------------------------------------
def load_engine(model_path: str | Path, batching: Batching = "exact", max_batch_size: int = 256, dtype: str = "float32") -> SeededHFEngine:
    """An engine on an HF directory (config + safetensors + tokenizer), on CPU."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
    return SeededHFEngine(model, tokenizer, max_batch_size=max_batch_size, batching=batching)


def hf_weight_files(path: str | Path) -> list[Path]:
    """The safetensors files of an HF dir: model.safetensors, or the shards its index names."""
    import json

    path = Path(path)
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise FileNotFoundError(f"{path}: index names missing shards {missing}")
        return [path / s for s in shards]
    raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json")


def iter_hf_weights(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every tensor in the HF dir's safetensors files, file by file."""
    from safetensors import safe_open

    for file in hf_weight_files(path):
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)

"""In-process transformers engine: batched sampling with a KV cache, seeded per request.

Log-probs are those of the sampled tokens under log_softmax(raw logits / temperature) — the
distribution the trainer recomputes — not of the top-k/top-p-processed scores used to sample.

Seeding contract: a result depends only on (weights, the request, the request's seed), never on the
other requests of its batch. ``generate(requests, seed)`` gives request i the seed
``request_seed(seed, i)``; ``generate_seeded(requests, seeds)`` takes the seeds explicitly (the HTTP
router derives them from the global index, then sends sub-batches to any engine). Request i draws its
``max_new_tokens`` uniforms u[i, t] (float64) from ``torch.Generator().manual_seed(seeds[i])`` up
front; at step t its token is the first index whose cumulative probability (float64 cumsum of the
filtered softmax) exceeds u[i, t] * total (inverse CDF: one vectorized searchsorted per step).
Temperature, top_k and top_p are per request: one batch may mix them, each row gets its own filter.

Seeds are necessary, not sufficient: float32 CPU kernels round differently with the batch shape (a
GEMM with 2 rows vs 16 rows differs in the last bits, ~1e-6 on the logits), so two batchings of the
same requests give the same tokens except at near-ties, and log-probs equal to ~1e-5. ``batching``:
  dynamic  requests are decoded together in chunks of ``max_batch_size`` (the in-process default).
  exact    every request is generated alone: results are bit-identical whatever the batch, the
           engine or the arrival order (the HTTP server's default).

Speed-ups, each exact up to that rounding (tests/rollout/test_hf_engine.py compares them with the
plain path): the prefill runs once per distinct prompt and its KV cache is expanded to the G rows
sharing it (``share_prefill``); finished rows leave the decode batch (``drop_finished``) — a row's
draws come from its own generator, so no other row's sample changes; the LM head runs on the last
position only; decode steps of Llama-family models skip the transformers call stack and use a static
KV cache (``lean_decode``, rollout/lean_decode.py). Generation runs under ``torch.inference_mode``.

Also for the HTTP server: ``aborted(i)``, polled every decode step, finishes row i with finish
reason "abort" and the tokens generated so far; ``progress`` counts decode steps (a liveness
heartbeat for /health_generate).
"""

from __future__ import annotations

import hashlib
import threading
from typing import Callable, Iterable, Literal, Sequence

import torch

from .dumper import Dumper, check_keys

from .adapters import ServedAdapters
from .lean_decode import LeanDecoder, lean_supported
from .protocol import GenerateRequest, GenerateResult, SamplingParams

Batching = Literal["exact", "dynamic"]
BATCHING: tuple[str, ...] = ("exact", "dynamic")
SEED_MODULUS = 2**62


def request_seed(seed: int, index: int) -> int:
    """Seed of request ``index`` of a ``generate(requests, seed)`` call: blake2b("seed:index") mod 2^62."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % SEED_MODULUS


class SeededGenerate:
    """``generate(requests, seed)`` written once, over the engine's ``generate_seeded(requests, seeds)``: request i
    gets ``request_seed(seed, i)`` (HFEngine, HTTPEngineClient and EngineRouter share it)."""

    def generate(self, requests: list[GenerateRequest], seed: int) -> list[GenerateResult]:
        return self.generate_seeded(requests, [request_seed(seed, i) for i in range(len(requests))])


# SGLang 0.5.23's weight-update session rule (managers/scheduler_components/weight_updater.py: begin_weight_update,
# end_weight_update, update_weights_from_tensor / _distributed); tests/rollout/sglang/test_protocol.py holds these
# messages to the snapshot taken from the wheel (miles_core/rollout/sglang/protocol.json).
SESSION_ALREADY_OPEN = "a weight-update session is already open; call end_weight_update() first"
SESSION_NOT_OPEN = "no weight-update session is open; call begin_weight_update() first"


def outside_session(route: str) -> str:
    return f"{route} must run between begin_weight_update() and end_weight_update()"


class WeightSessionError(RuntimeError):
    """A weight update outside a begin/end weight-update session (or a session opened twice)."""


def filter_logits(logits: torch.Tensor, top_k: int | Sequence[int], top_p: float | Sequence[float]) -> torch.Tensor:
    """Mask logits [B, V] outside top-k, then outside nucleus top-p, with -inf (for sampling only).

    ``top_k`` / ``top_p``: one value for every row, or one per row (top_k <= 0 or >= V: off; top_p >= 1: off).
    Ties at the k-th value are kept; top-p keeps the smallest prefix of the top-k distribution reaching p."""
    B, V = logits.shape
    k = torch.as_tensor(top_k, dtype=torch.long, device=logits.device).reshape(-1).expand(B)  # [B]
    k = torch.where((k > 0) & (k < V), k, V)
    if bool((k < V).any()):
        kmax = int(k[k < V].max())
        kth = torch.topk(logits, kmax, dim=-1).values.gather(-1, (k.clamp(max=kmax) - 1)[:, None])  # [B, 1]
        kth = torch.where((k < V)[:, None], kth, float("-inf"))
        logits = logits.masked_fill(logits < kth, float("-inf"))
    p = torch.as_tensor(top_p, dtype=torch.float64, device=logits.device).reshape(-1).expand(B)  # [B]
    if bool((p < 1.0).any()):
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, dim=-1)
        limit = torch.where(p < 1.0, p, float("inf")).to(probs.dtype)[:, None]  # [B, 1]
        drop = probs.cumsum(-1) - probs > limit  # keep the smallest prefix reaching top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


class RowSampler:
    """Per-row sampling state of one decode batch: temperature, top_k, top_p and the row's own uniforms
    (drawn up front from its generator), kept in the batch's current row order. A row with ``min_new_tokens``
    cannot sample its stop ids before that many tokens (SGLang 0.5.23's BatchedMinNewTokensPenalizer,
    sampling/penaltylib/min_new_tokens.py: -inf on EOS and stop_token_ids; stop strings still match); its
    log-probs stay those of the unmasked logits / T, as every row's."""

    def __init__(self, requests: list[GenerateRequest], gens: list[torch.Generator], device,
                 stops: Sequence[set[int]] = ()):
        max_new = [r.params.max_new_tokens for r in requests]
        self.steps = max(max_new, default=0)
        self.u = torch.zeros((len(requests), self.steps), dtype=torch.float64)  # [B, T]
        for i, n in enumerate(max_new):
            self.u[i, :n] = torch.rand(n, generator=gens[i], dtype=torch.float64)
        temps = [r.params.temperature for r in requests]
        self.temp = None if all(t == 1.0 for t in temps) else torch.tensor(temps, dtype=torch.float32, device=device)[:, None]  # [B, 1]
        self.top_k = torch.tensor([r.params.top_k for r in requests])  # [B]
        self.top_p = torch.tensor([r.params.top_p for r in requests], dtype=torch.float64)  # [B]
        self.filtered = any(r.params.top_k > 0 or r.params.top_p < 1.0 for r in requests)
        self.device = device
        early = any(r.params.min_new_tokens > 0 for r in requests)
        self.min_new = torch.tensor([r.params.min_new_tokens for r in requests]) if early else None  # [B]
        self.stop_ids = [sorted(s) for s in stops] if early else []

    def select(self, rows: torch.Tensor) -> None:
        self.u, self.top_k, self.top_p = self.u[rows], self.top_k[rows], self.top_p[rows]
        if self.min_new is not None:
            self.min_new, self.stop_ids = self.min_new[rows], [self.stop_ids[r] for r in rows.tolist()]
        if self.temp is not None:
            self.temp = self.temp[rows.to(self.device)]

    def sample(self, logits: torch.Tensor, step: int, finished: list[bool], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [b, V] -> (token [b] by inverse CDF at the row's uniform, its log-prob [b] under logits / T);
        finished rows get ``pad``. (x / 1.0 == x, so temperature 1 skips the division.)"""
        last = logits.float() if self.temp is None else logits.float() / self.temp  # [b, V]
        logp = torch.log_softmax(last, dim=-1)
        scores = filter_logits(last, self.top_k, self.top_p) if self.filtered else last
        if self.min_new is not None and bool((self.min_new > step).any()):
            scores = scores.clone()  # the log-probs above keep the unmasked logits
            for r in (self.min_new > step).nonzero().flatten().tolist():
                scores[r, self.stop_ids[r]] = float("-inf")
        cdf = torch.softmax(scores, dim=-1).cpu().double().cumsum(-1)  # [b, V]
        nxt = torch.searchsorted(cdf, self.u[:, step : step + 1] * cdf[:, -1:], right=True).squeeze(-1)  # [b]
        nxt = nxt.clamp(max=cdf.shape[-1] - 1)
        if any(finished):
            nxt = nxt.masked_fill(torch.tensor(finished), pad)
        return nxt, logp.gather(-1, nxt.to(self.device)[:, None]).squeeze(-1).cpu()


class HFEngine(SeededGenerate):
    """Serves generate() on one transformers causal LM in this process (one engine, per-request seeds).

    Weight updates follow SGLang's session rule: ``update_weights_from_tensor`` only between
    ``begin_weight_update()`` and ``end_weight_update()``; ``load_weights`` (a disk reload) needs none."""

    def __init__(self, model, tokenizer, max_batch_size: int = 256, batching: Batching = "dynamic",
                 share_prefill: bool = True, drop_finished: bool = True, lean_decode: bool = True):
        if batching not in BATCHING:
            raise ValueError(f"batching={batching!r}: expected one of {BATCHING}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.batching = batching
        self.share_prefill, self.drop_finished = share_prefill, drop_finished
        self.lean_decode = lean_decode and lean_supported(model)
        self.weight_version = 0
        self.progress = 0  # decode steps run so far (read by the HTTP server's health check)
        self._running = threading.Event()
        self._running.set()
        self.in_weight_session = False
        self.adapters = ServedAdapters()  # LoRA adapters served unmerged (rollout/adapters.py)
        self.dumper = Dumper()  # tensor dumps of the forward passes (dumper_inference: SGLang's /dumper/{method})
        self._dump_hooked = False
        self.model.register_forward_hook(lambda *_: self.dumper.step())  # a step per forward pass, as SGLang's model runner

    @classmethod
    def from_pretrained(cls, path, dtype: str = "float32", device: str = "cpu", **engine_kwargs) -> "HFEngine":
        """An engine on an HF directory (config + safetensors + tokenizer) in ``dtype``, on ``device`` (cpu | cuda |
        auto: miles_core/device.py); ``engine_kwargs`` go to the constructor (batching, max_batch_size, tokenizer)."""
        from transformers import AutoTokenizer

        from miles_core.checkpoint.hf_load import load_hf_model  # safetensors headers checked against config.json first
        from miles_core.device import resolve_device

        tokenizer = engine_kwargs.pop("tokenizer", None) or AutoTokenizer.from_pretrained(path)
        model = load_hf_model(path, dtype=getattr(torch, dtype)).to(resolve_device(device))
        return cls(model, tokenizer, **engine_kwargs)

    # ---- generation -----------------------------------------------------------------------

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
            lora = requests[batch[0]].lora_path
            with self.adapters.serving(self.model, lora):
                rows = self._generate_rows([requests[i] for i in batch], gens, row_aborted, lean=self.adapters.injected is None)
            for i, res in zip(batch, rows):
                results[i] = res
        return results  # type: ignore[return-value]

    def plan_batches(self, requests: list[GenerateRequest]) -> list[list[int]]:
        """Indices of the requests that share each decode batch, in order; a batch's requests share one lora_path."""
        size = 1 if self.batching == "exact" else self.max_batch_size
        groups: dict[str | None, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(r.lora_path, []).append(i)
        return [idx[s : s + size] for idx in groups.values() for s in range(0, len(idx), size)]

    @torch.inference_mode()
    def _generate_rows(
        self, requests: list[GenerateRequest], gens: list[torch.Generator], aborted: Callable[[int], bool], lean: bool = True
    ) -> list[GenerateResult]:
        """``lean``: decode steps may skip the transformers call stack (not with adapter layers in the model: it reads the weights)."""
        device = next(self.model.parameters()).device
        B, pad = len(requests), self.tokenizer.pad_token_id
        stops = [set(r.params.stop_token_ids) | {self.tokenizer.eos_token_id} for r in requests]
        max_new = [r.params.max_new_tokens for r in requests]
        sampler = RowSampler(requests, gens, device, stops)
        out_ids: list[list[int]] = [[] for _ in range(B)]
        out_lp: list[list[float]] = [[] for _ in range(B)]
        reason, done = ["length"] * B, [False] * B
        self._mark_aborted(aborted, done, reason)
        rows = list(range(B))  # request index of each row still in the decode batch (and its KV cache)
        logits, past, attn, pos = self._prefill(requests, device)  # [B, V], cache of B rows, [B, P], [B, 1]
        lean = lean and not self.dumper.options.enable  # dumps need every decode step through the model's modules
        lean = LeanDecoder(self.model, past, attn, sampler.steps) if self.lean_decode and lean else None
        for step in range(sampler.steps):
            if all(done):
                break
            if lean is not None and step:
                logits = lean.step(nxt.to(device), pos)
            elif step:
                out = self.model(input_ids=nxt.to(device)[:, None], attention_mask=attn, position_ids=pos,
                                 past_key_values=past, use_cache=True, logits_to_keep=1)
                past, logits = out.past_key_values, out.logits[:, -1, :]
            nxt, tok_lp = sampler.sample(logits, step, [done[i] for i in rows], pad)  # [b], [b]
            for i, t, lp in zip(rows, nxt.tolist(), tok_lp.tolist()):
                if done[i]:
                    continue
                out_ids[i].append(t)
                out_lp[i].append(lp)
                if t in stops[i] or self._hit_stop_string(out_ids[i], requests[i].params):
                    done[i], reason[i] = True, "stop"
                elif len(out_ids[i]) >= max_new[i]:
                    done[i] = True
            self.progress += 1
            self._mark_aborted(aborted, done, reason)
            keep = [r for r, i in enumerate(rows) if not done[i]]
            if self.drop_finished and keep and len(keep) < len(rows):  # later steps compute only live rows
                sel = torch.tensor(keep)
                sampler.select(sel)
                if lean is not None:
                    lean.select(sel.to(device))
                else:
                    past.batch_select_indices(sel.to(device))
                nxt, attn, pos = nxt[sel], attn[sel.to(device)], pos[sel.to(device)]
                rows = [rows[r] for r in keep]
            if lean is None:
                attn = torch.cat([attn, torch.ones((len(rows), 1), dtype=attn.dtype, device=device)], dim=1)
            pos = pos + 1
        return [
            GenerateResult(out_ids[i], out_lp[i], reason[i], self.weight_version, prompt_tokens=len(r.input_ids))
            for i, r in enumerate(requests)
        ]

    def _prefill(self, requests: list[GenerateRequest], device):
        """One forward over the prompts (with ``share_prefill``, each distinct prompt once: the G samples of
        a group share theirs), then the KV cache and last-position logits are copied to every request's row.
        -> (logits [B, V], cache of B rows, attention mask [B, P], position of the last token [B, 1])."""
        index: dict[tuple[int, ...], int] = {}
        if self.share_prefill:
            owner = [index.setdefault(tuple(r.input_ids), len(index)) for r in requests]  # [B] distinct-prompt row
            prompts = list(index)
        else:
            owner, prompts = list(range(len(requests))), [tuple(r.input_ids) for r in requests]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.tokenizer.pad_token_id, dtype=torch.long)  # [U, P] left-padded
        attn = torch.zeros((len(prompts), width), dtype=torch.long)
        for u, p in enumerate(prompts):
            ids[u, width - len(p) :] = torch.tensor(p)
            attn[u, width - len(p) :] = 1
        ids, attn = ids.to(device), attn.to(device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # [U, P]
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1)
        if len(prompts) == len(requests):
            return out.logits[:, -1, :], out.past_key_values, attn, pos[:, -1:]
        rows = torch.tensor(owner, device=device)  # [B]
        out.past_key_values.batch_select_indices(rows)
        return out.logits[rows, -1, :], out.past_key_values, attn[rows], pos[rows, -1:]

    @staticmethod
    def _mark_aborted(aborted: Callable[[int], bool], done: list[bool], reason: list[str]) -> None:
        for i in range(len(done)):
            if not done[i] and aborted(i):
                done[i], reason[i] = True, "abort"

    def _hit_stop_string(self, ids: list[int], params: SamplingParams) -> bool:
        if not params.stop:
            return False
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return any(text.endswith(s) for s in params.stop)

    def score(self, input_ids_list: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        """Prefill-only scoring (SGLang input_token_logprobs without the leading None): for L ids,
        L - 1 log-probs, entry j = log p(ids[j+1] | ids[:j+1]) under logits / temperature."""
        from miles_core.models.scoring import score_tokens

        return score_tokens(self.model, input_ids_list, temperature, self.max_batch_size)

    # ---- weights and control ----------------------------------------------------------------
    def begin_weight_update(self) -> None:
        if self.in_weight_session:
            raise WeightSessionError(SESSION_ALREADY_OPEN)
        self.in_weight_session = True

    def end_weight_update(self) -> None:
        if not self.in_weight_session:
            raise WeightSessionError(SESSION_NOT_OPEN)
        self.in_weight_session = False

    def update_weights_from_tensor(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy the tensors in (inside a weight-update session only, as SGLang)."""
        if not self.in_weight_session:
            raise WeightSessionError(outside_session("update_weights_from_tensor"))
        self.load_weights(named_tensors)

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy the tensors into the parameters of the same names (no session needed: a reload from disk)."""
        params = self.model.state_dict(keep_vars=True)  # includes tied aliases such as lm_head.weight
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"engine has no parameter {name!r}")
            params[name].copy_(tensor)

    def update_weights_from_disk(self, model_path: str) -> None:
        """Reload every tensor of the HF dir ``model_path`` (SGLang's /update_weights_from_disk, in process)."""
        from .hf_files import iter_hf_weights

        self.load_weights(iter_hf_weights(model_path))

    def pull_weights(self, source_dir: str, local_checkpoint_dir: str, target_version: int) -> int:
        """disk-delta: bring ``local_checkpoint_dir`` to ``target_version`` published under ``source_dir``
        (weights/delta.py pull: every delta verified before it is written); the weights served do not change
        until update_weights_from_disk(local_checkpoint_dir). -> the version the local checkpoint holds."""
        from miles_core.weights.delta import pull

        return pull(local_checkpoint_dir, source_dir, target_version)

    def check_weights(self, action: str, skip_list: Sequence[str] | None = None, allow_quant_error: bool = False,
                      selector: str = "all") -> str | dict:
        """SGLang's weights checker (snapshot | reset_tensors | compare | checksum; rollout/weight_checker.py): one model,
        no quantized tensors, so every selector but "draft" checks it and allow_quant_error changes nothing."""
        from .weight_checker import WeightChecker

        if selector == "draft":
            raise ValueError("weights checker: this engine has no draft model (selector draft)")
        if getattr(self, "_weight_checker", None) is None:
            self._weight_checker = WeightChecker(self.model)
        return self._weight_checker.handle(action, tuple(skip_list or ()))

    def weight_checksums(self) -> list[dict[str, str]]:
        """[{tensor name: sha256 hex}] of the weights this engine holds (one engine; save_local_weight_checksum)."""
        return [self.check_weights("checksum")["checksums"]]

    def load_lora_adapter_from_tensors(self, lora_name: str, config_dict: dict,
                                       named_tensors: Iterable[tuple[str, torch.Tensor]],
                                       expected_checksums: dict[str, str] | None = None) -> None:
        """SGLang's load of an adapter from tensors (no weight-update session: SGLang needs none), served unmerged;
        ``expected_checksums``: SGLang's per-tensor sha256 check of what arrived (rollout/adapters.py)."""
        self.adapters.load(self.model, lora_name, config_dict, named_tensors, expected_checksums)

    def load_lora_adapter(self, lora_name: str, lora_path: str) -> None:
        """SGLang's /load_lora_adapter: the PEFT adapter dir at ``lora_path`` (adapter_config.json + adapter_model.safetensors)."""
        from .adapters import read_adapter_dir

        self.adapters.load(self.model, lora_name, *read_adapter_dir(lora_path))

    def unload_lora_adapter(self, lora_name: str) -> None:
        self.adapters.unload(lora_name)

    def reload_lora_adapter(self, lora_name: str, config_dict: dict, named_tensors: Iterable[tuple[str, torch.Tensor]],
                            expected_checksums: dict[str, str] | None = None) -> None:
        """A weight sync's load (lora_sync_from_tensor): unload ``lora_name`` if loaded, then load these tensors."""
        if lora_name in self.adapters.loaded:
            self.adapters.unload(lora_name)
        self.adapters.load(self.model, lora_name, config_dict, named_tensors, expected_checksums)

    # ---- tensor dumps (dumper.py) -----------------------------------------------------------------------
    def dumper_control(self, method: str, body: dict) -> list[dict]:
        """SGLang's /dumper/{method}: configure (DumperConfig fields; the non-intrusive hooks go on at the first enabled
        configure, in its non_intrusive_mode), reset (hooks off, step 0), get_state; -> one result per rank (one)."""
        if method == "configure":
            check_keys(body, "/dumper/configure")
            self.dumper.configure(**body)
            if self.dumper.options.enable and not self._dump_hooked:
                self.dumper.hook(self.model)
                self._dump_hooked = True
            return [{}]
        if method == "reset":
            self.dumper.reset()
            self._dump_hooked = False
            return [{}]
        if method == "get_state":
            return [self.dumper.state()]
        raise ValueError(f"unknown dumper control method {method!r}: configure, reset or get_state")

    def configure_dumper(self, body_of: Callable[[int], dict]) -> None:
        """dumper_inference before a rollout: this engine is engine 0."""
        self.dumper_control("configure", body_of(0))

    def set_weight_version(self, version: int) -> None:
        self.weight_version = version

    def get_weight_version(self) -> int:
        return self.weight_version

    def health(self) -> bool:
        return True

    def pause_generation(self) -> None:
        self._running.clear()

    def continue_generation(self) -> None:
        self._running.set()

    def flush_cache(self) -> None:
        """No prefix cache is kept between calls; nothing to flush."""

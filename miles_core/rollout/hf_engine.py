"""In-process transformers engine: batched sampling with a KV cache.

Log-probs are those of the sampled tokens under log_softmax(raw logits / temperature) — the
distribution the trainer recomputes — not of the top-k/top-p-processed scores used to sample.
Sampling draws from a torch.Generator seeded by the caller, so a rollout is reproducible.
"""

from __future__ import annotations

import threading
from typing import Iterable

import torch

from .protocol import GenerateRequest, GenerateResult, SamplingParams


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits [B, V] outside top-k / nucleus top-p with -inf (for sampling only)."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest prefix reaching top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


class HFEngine:
    """Serves generate() on one transformers causal LM in this process."""

    def __init__(self, model, tokenizer, max_batch_size: int = 256):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.weight_version = 0
        self._running = threading.Event()
        self._running.set()

    # ---- generation -----------------------------------------------------------------------
    def generate(self, requests: list[GenerateRequest], seed: int) -> list[GenerateResult]:
        self._running.wait()
        gen = torch.Generator().manual_seed(seed)
        results: list[GenerateResult] = []
        for start in range(0, len(requests), self.max_batch_size):
            results.extend(self._generate_batch(requests[start : start + self.max_batch_size], gen))
        return results

    @torch.no_grad()
    def _generate_batch(self, requests: list[GenerateRequest], gen: torch.Generator) -> list[GenerateResult]:
        params = requests[0].params
        if any(r.params.temperature != params.temperature for r in requests):
            raise ValueError("one generate() batch must share a temperature")
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
        max_new = torch.tensor([r.params.max_new_tokens for r in requests])
        stops = [set(r.params.stop_token_ids) | {self.tokenizer.eos_token_id} for r in requests]
        out_ids: list[list[int]] = [[] for _ in range(B)]
        out_lp: list[list[float]] = [[] for _ in range(B)]
        reason = ["length"] * B
        done = torch.zeros(B, dtype=torch.bool)
        past, step_input = None, ids
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # [B, P]
        for step in range(int(max_new.max())):
            logits = self.model(input_ids=step_input, attention_mask=attn, position_ids=pos, past_key_values=past, use_cache=True)
            past = logits.past_key_values
            last = logits.logits[:, -1, :].float() / params.temperature  # [B, V]
            logp = torch.log_softmax(last, dim=-1)
            probs = torch.softmax(filter_logits(last, params.top_k, params.top_p), dim=-1)
            nxt = torch.multinomial(probs.cpu(), 1, generator=gen).squeeze(-1)  # [B]
            tok_lp = logp.gather(-1, nxt.to(device)[:, None]).squeeze(-1).cpu()
            for i in range(B):
                if done[i]:
                    continue
                t = int(nxt[i])
                out_ids[i].append(t)
                out_lp[i].append(float(tok_lp[i]))
                if t in stops[i] or self._hit_stop_string(out_ids[i], requests[i].params):
                    done[i], reason[i] = True, "stop"
                elif len(out_ids[i]) >= max_new[i]:
                    done[i] = True
            if bool(done.all()):
                break
            step_input = nxt.to(device)[:, None]
            attn = torch.cat([attn, torch.ones((B, 1), dtype=attn.dtype, device=device)], dim=1)
            pos = pos[:, -1:] + 1
        return [
            GenerateResult(out_ids[i], out_lp[i], reason[i], self.weight_version, prompt_tokens=len(r.input_ids))
            for i, r in enumerate(requests)
        ]

    def _hit_stop_string(self, ids: list[int], params: SamplingParams) -> bool:
        if not params.stop:
            return False
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return any(text.endswith(s) for s in params.stop)

    def score(self, input_ids_list: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        """Prefill-only scoring (SGLang input_token_logprobs without the leading None): for L ids,
        L - 1 log-probs, entry j = log p(ids[j+1] | ids[:j+1]) under logits / temperature."""
        from miles_core.training.teacher import score_tokens

        return score_tokens(self.model, input_ids_list, temperature, self.max_batch_size)

    # ---- weights and control ----------------------------------------------------------------
    @torch.no_grad()
    def update_weights_from_tensor(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = self.model.state_dict(keep_vars=True)  # includes tied aliases such as lm_head.weight
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"engine has no parameter {name!r}")
            params[name].copy_(tensor)

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

"""Scoring token ids under a temperature: what an in-process engine's ``score`` (prefill-only, SGLang's
input_token_logprobs) runs. Below both rollout/ and training/, so engines and trainers need not import each other."""

from __future__ import annotations

import torch


@torch.no_grad()
def score_tokens(model, input_ids_list: list[list[int]], temperature: float = 1.0, micro_batch_size: int = 32) -> list[list[float]]:
    """Prefill-only scoring. For a sequence of L ids -> L - 1 floats, entry j = log p(ids[j+1] | ids[:j+1])
    under log_softmax(logits / temperature) (SGLang's input_token_logprobs without its leading None)."""
    model.eval()
    device = next(model.parameters()).device  # ids go where the model is
    out: list[list[float]] = []
    for s in range(0, len(input_ids_list), micro_batch_size):
        chunk = input_ids_list[s : s + micro_batch_size]
        L = max(len(x) for x in chunk)
        ids = torch.zeros((len(chunk), L), dtype=torch.long)  # [n, L] right-padded
        mask = torch.zeros((len(chunk), L), dtype=torch.long)
        for i, x in enumerate(chunk):
            ids[i, : len(x)] = torch.tensor(x)
            mask[i, : len(x)] = 1
        ids, mask = ids.to(device), mask.to(device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, :-1].float() / temperature  # [n, L-1, V]
        lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # [n, L-1]
        out.extend(lp[i, : len(x) - 1].tolist() for i, x in enumerate(chunk))
    return out

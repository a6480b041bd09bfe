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


@torch.no_grad()
def input_logprobs(model, input_ids: list[int], start: int = 0, top_k: int = 0,
                   token_ids: list[int] | None = None) -> dict[str, list]:
    """SGLang's prefill-only meta_info fields of one sequence (GenerateReqInput return_logprob with
    logprob_start_len ``start``, top_logprobs_num ``top_k``, token_ids_logprob ``token_ids``), one entry per input
    token from ``start`` on, each ``[logprob, token_id, None]`` (return_text_in_logprobs off):

        input_token_logprobs      [[log p(ids[j] | ids[:j]), ids[j], None], ...]; None logprob for token 0
        input_top_logprobs        per token, the top_k [logprob, id, None] of the distribution predicting it,
                                  highest first (None for token 0); only with top_k > 0
        input_token_ids_logprobs  per token, [logprob, id, None] of each of token_ids, in their order (None for
                                  token 0); only with token_ids

    Log-probs are log_softmax of the raw logits, as SGLang's logits processor computes input log-probs (no
    temperature)."""
    model.eval()
    device = next(model.parameters()).device
    ids = torch.tensor([input_ids], device=device)  # [1, L]
    logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)  # [L-1, V]: row j predicts ids[j+1]
    rows = range(max(start, 1) - 1, len(input_ids) - 1)  # the rows predicting tokens max(start, 1) .. L-1
    lead = start == 0  # token 0 has no distribution: SGLang's placeholder entry
    entry = lambda lp, t: [float(lp), int(t), None]  # noqa: E731
    out: dict[str, list] = {"input_token_logprobs": ([[None, int(input_ids[0]), None]] if lead else [])
                            + [entry(logp[j, input_ids[j + 1]], input_ids[j + 1]) for j in rows]}
    if top_k > 0:
        vals, idx = logp[list(rows)].topk(min(top_k, logp.shape[-1]), dim=-1)  # [R, k]
        out["input_top_logprobs"] = ([None] if lead else []) + [
            [entry(v, t) for v, t in zip(vr.tolist(), ir.tolist())] for vr, ir in zip(vals, idx)]
    if token_ids:
        want = torch.tensor(token_ids, device=device)
        picked = logp[list(rows)][:, want]  # [R, len(token_ids)]
        out["input_token_ids_logprobs"] = ([None] if lead else []) + [
            [entry(v, t) for v, t in zip(row.tolist(), token_ids)] for row in picked]
    return out

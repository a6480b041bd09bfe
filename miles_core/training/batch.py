"""Samples -> padded tensors. Full sequences right-padded [N, L]; response views [N, T] gathered
by index so that response token j of sample i is predicted by the logits at p_i + j - 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from miles_core.data.sample import Sample


@dataclass
class TokenBatch:
    input_ids: torch.Tensor  # [N, L]
    attention_mask: torch.Tensor  # [N, L]
    resp_index: torch.Tensor  # [N, T] positions of the logits predicting each response token
    resp_tokens: torch.Tensor  # [N, T]
    loss_mask: torch.Tensor  # [N, T] float
    rollout_log_probs: torch.Tensor  # [N, T]

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def slice(self, start: int, end: int) -> "TokenBatch":
        """Rows [start, end), trimmed to the longest sequence and response among them."""
        L = int(self.attention_mask[start:end].sum(-1).max())
        T = max(int((self.resp_index[start:end] >= 0).sum(-1).max()), 1)
        return TokenBatch(
            self.input_ids[start:end, :L], self.attention_mask[start:end, :L],
            self.resp_index[start:end, :T], self.resp_tokens[start:end, :T],
            self.loss_mask[start:end, :T], self.rollout_log_probs[start:end, :T],
        )

    def take(self, rows: list[int]) -> "TokenBatch":
        """Rows by index (in that order), trimmed like slice; take(list(range(a, b))) == slice(a, b)."""
        if rows == list(range(rows[0], rows[-1] + 1)):
            return self.slice(rows[0], rows[-1] + 1)
        idx = torch.tensor(rows)
        return TokenBatch(*(t[idx] for t in (self.input_ids, self.attention_mask, self.resp_index, self.resp_tokens,
                                             self.loss_mask, self.rollout_log_probs))).slice(0, len(rows))


def make_batch(samples: list[Sample], pad_id: int) -> TokenBatch:
    N = len(samples)
    L = max(len(s.tokens) for s in samples)
    T = max(max(s.response_length for s in samples), 1)
    input_ids = torch.full((N, L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((N, L), dtype=torch.long)
    resp_index = torch.full((N, T), -1, dtype=torch.long)
    resp_tokens = torch.full((N, T), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((N, T))
    rollout_lp = torch.zeros((N, T))
    for i, s in enumerate(samples):
        n, p, t = len(s.tokens), s.prompt_length, s.response_length
        input_ids[i, :n] = torch.tensor(s.tokens)
        attention_mask[i, :n] = 1
        if t:
            resp_index[i, :t] = torch.arange(p - 1, p - 1 + t)
            resp_tokens[i, :t] = torch.tensor(s.tokens[p:])
            loss_mask[i, :t] = torch.tensor(s.loss_mask, dtype=torch.float)
            rollout_lp[i, :t] = torch.tensor(s.rollout_log_probs)
    return TokenBatch(input_ids, attention_mask, resp_index, resp_tokens, loss_mask, rollout_lp)


def per_token(samples: list[Sample], name: str, T: int) -> torch.Tensor:
    """A per-response-token list field of each sample (e.g. ``teacher_log_probs``) right-padded to [N, T]."""
    out = torch.zeros((len(samples), T))
    for i, s in enumerate(samples):
        values = getattr(s, name)
        if values is None or len(values) != s.response_length:
            got = "None" if values is None else f"{len(values)} values"
            raise ValueError(f"sample {s.index} (group {s.group_index}): {name} has {got}, expected response_length={s.response_length}")
        out[i, : len(values)] = torch.tensor(values, dtype=torch.float)
    return out


def forward(model, batch: TokenBatch):
    """The model's output on the padded sequences (position ids count real tokens only)."""
    pos = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)  # [N, L]
    return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=pos)


def at_response(x: torch.Tensor, batch: TokenBatch) -> torch.Tensor:
    """x [N, L, D] -> [N, T, D]: row t is x at the position whose output predicts response token t."""
    idx = batch.resp_index.clamp(min=0)  # [N, T]
    return x.gather(1, idx[..., None].expand(-1, -1, x.shape[-1]))


@torch.no_grad()
def forward_only(fn, batch: TokenBatch, micro_batch_size: int) -> torch.Tensor:
    """fn(piece) -> [n, t] over micro-batches, right-padded and concatenated to [N, T] (no grad)."""
    T = batch.loss_mask.shape[1]
    parts = []
    for s in range(0, len(batch), micro_batch_size):
        out = fn(batch.slice(s, s + micro_batch_size))
        parts.append(torch.nn.functional.pad(out, (0, T - out.shape[1])))
    return torch.cat(parts)


def response_log_probs(model, batch: TokenBatch, temperature: float, with_entropy: bool):
    """-> (log-probs [N, T] of the response tokens under log_softmax(logits / T), entropy [N, T] or None)."""
    from miles_core.algorithms import entropy_from_logits

    logits = forward(model, batch).logits  # [N, L, V]
    resp_logits = at_response(logits, batch).float() / temperature  # [N, T, V]
    logp_all = torch.log_softmax(resp_logits, dim=-1)
    logp = logp_all.gather(-1, batch.resp_tokens[..., None]).squeeze(-1)  # [N, T]
    entropy = entropy_from_logits(resp_logits) if with_entropy else None
    return logp, entropy

"""Samples -> padded tensors. Full sequences right-padded [N, L]; response views [N, T] gathered
by index so that response token j of sample i is predicted by the logits at p_i + j - 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from miles_core.data.sample import Sample
from miles_core.models.lm_head import lm_head


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

    def to(self, device) -> "TokenBatch":
        """The same batch with every tensor on ``device`` (the trainer's: built on the CPU, trained where the model is)."""
        return TokenBatch(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.resp_index, self.resp_tokens,
                                                   self.loss_mask, self.rollout_log_probs)))

    def take(self, rows: list[int]) -> "TokenBatch":
        """Rows by index (in that order), trimmed like slice; take(list(range(a, b))) == slice(a, b)."""
        if rows == list(range(rows[0], rows[-1] + 1)):
            return self.slice(rows[0], rows[-1] + 1)
        idx = torch.tensor(rows)
        return TokenBatch(*(t[idx] for t in (self.input_ids, self.attention_mask, self.resp_index, self.resp_tokens,
                                             self.loss_mask, self.rollout_log_probs))).slice(0, len(rows))


def make_batch(samples: list[Sample], pad_id: int) -> TokenBatch:
    """The samples as right-padded tensors: [N, L] tokens and mask, [N, T] response fields (built as lists, one
    tensor per field)."""
    L = max(len(s.tokens) for s in samples)
    T = max(max(s.response_length for s in samples), 1)
    for s in samples:
        for name in ("loss_mask", "rollout_log_probs"):
            if s.response_length and len(getattr(s, name)) != s.response_length:
                raise ValueError(f"sample {s.index} (group {s.group_index}): {name} has {len(getattr(s, name))} values, "
                                 f"expected response_length={s.response_length}")

    def right_pad(rows, width, fill):
        return [list(r) + [fill] * (width - len(r)) for r in rows]

    resp = [(s.prompt_length, s.response_length) for s in samples]
    return TokenBatch(
        torch.tensor(right_pad((s.tokens for s in samples), L, pad_id), dtype=torch.long),  # [N, L]
        torch.tensor(right_pad(([1] * len(s.tokens) for s in samples), L, 0), dtype=torch.long),  # [N, L]
        torch.tensor(right_pad((range(p - 1, p - 1 + t) for p, t in resp), T, -1), dtype=torch.long),  # [N, T]
        torch.tensor(right_pad((s.tokens[p : p + t] for s, (p, t) in zip(samples, resp)), T, pad_id), dtype=torch.long),
        torch.tensor(right_pad((s.loss_mask if t else [] for s, (_, t) in zip(samples, resp)), T, 0.0), dtype=torch.float),
        torch.tensor(right_pad((s.rollout_log_probs if t else [] for s, (_, t) in zip(samples, resp)), T, 0.0), dtype=torch.float),
    )


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
    """The model's output on the padded sequences (position ids count real tokens only). No KV cache: nothing reads
    it, and under torch_compile each layer's first cache write would compile a graph of its own."""
    pos = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)  # [N, L]
    return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=pos, use_cache=False)


def at_response(x: torch.Tensor, batch: TokenBatch) -> torch.Tensor:
    """x [N, L, D] -> [N, T, D]: row t is x at the position whose output predicts response token t."""
    idx = batch.resp_index.clamp(min=0)  # [N, T]
    return x.gather(1, idx[..., None].expand(-1, -1, x.shape[-1]))


@torch.no_grad()
def forward_only(fn, batch: TokenBatch, micro_batch_size: int, loop=iter) -> torch.Tensor:
    """fn(piece) -> [n, t] over micro-batches, right-padded and concatenated to [N, T] (no grad); ``loop`` wraps the
    micro-batches' start rows (a profiler's steps: profiler.TrainProfiler.loop)."""
    T = batch.loss_mask.shape[1]
    parts = []
    for s in loop(range(0, len(batch), micro_batch_size)):
        out = fn(batch.slice(s, s + micro_batch_size))
        parts.append(torch.nn.functional.pad(out, (0, T - out.shape[1])))
    return torch.cat(parts)


# Model types whose CausalLM forward is lm_head(base_model(...)) with nothing in between (no logit
# scaling or soft-capping) and full attention: their response logits can be computed from packed rows
# (response_logits). A sliding window would be lost under the packed 4D mask, so it disqualifies.
PACKABLE_MODEL_TYPES = frozenset({"qwen2", "qwen3", "llama"})


def packable(model) -> bool:
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) in PACKABLE_MODEL_TYPES and not getattr(config, "use_sliding_window", False)


def pack_rows(lengths: list[int], width: int) -> list[list[int]]:
    """First-fit decreasing: sample indices per packed row of at most ``width`` tokens (width >= max length)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        r = next((r for r, free in enumerate(room) if free >= lengths[i]), None)
        if r is None:
            rows.append([]), room.append(width)
            r = len(rows) - 1
        rows[r].append(i)
        room[r] -= lengths[i]
    return rows


def karmarkar_karp(weights: list[float], k: int) -> list[list[int]]:
    """Indices of ``weights`` in k groups of near-equal sums, by the largest differencing method (Karmarkar-Karp,
    k-way, sizes free): each item starts as a k-tuple of subsets (itself, then empties); the two tuples of largest
    spread (max - min sum) are merged, the heaviest subset of one with the lightest of the other, until one is left.
    Empty groups (k > len(weights), or a dominant item) are dropped."""
    import heapq

    heap = [(-w, i, [(w, [i])] + [(0.0, [])] * (k - 1)) for i, w in enumerate(weights)]
    heapq.heapify(heap)
    tie = len(weights)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = sorted(((a[j][0] + b[k - 1 - j][0], a[j][1] + b[k - 1 - j][1]) for j in range(k)), key=lambda x: -x[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), tie, merged))
        tie += 1
    return [sorted(items) for _, items in heap[0][2] if items] if heap else []


def prompt_units(batch: TokenBatch) -> tuple[list[list[int]], list[int]]:
    """Samples grouped by identical prompt tokens (the G samples of a group): (members of each unit, prompt
    length of each sample). A sample without response tokens is all prompt."""
    lengths = batch.attention_mask.sum(-1).tolist()  # [N]
    first = batch.resp_index[:, 0].tolist()  # [N] position predicting response token 0 = prompt length - 1
    plen = [f + 1 if f >= 0 else n for f, n in zip(first, lengths)]
    units: dict[tuple[int, ...], list[int]] = {}
    for i, row in enumerate(batch.input_ids.tolist()):
        units.setdefault(tuple(row[: plen[i]]), []).append(i)
    return list(units.values()), plen


def padded_to(n: int, multiple: int) -> int:
    """n rounded up to a multiple of ``multiple`` (data_pad_size_multiplier)."""
    return -(-n // multiple) * multiple


def padded_width(width: int, rows: int, multiple: int) -> int:
    """The least width >= ``width`` at which ``rows`` rows hold a multiple of ``multiple`` tokens: the reference's
    get_batch pads a packed micro-batch's tokens, all samples together, to a multiple of data_pad_size_multiplier, so
    rows of the torch trainer's layout are widened by at most multiple / gcd(rows, multiple) - 1 slots each."""
    return padded_to(width, multiple // math.gcd(rows, multiple))


def padded_layout(lengths: list[int], multiple: int) -> tuple[list[list[int]], int]:
    """Units of ``lengths`` packed into rows (first-fit decreasing) of one width W, the rows (empty ones added) holding
    a multiple of ``multiple`` slots together, as few as the widths max(lengths) .. + multiple - 1 allow (a wider row
    may take more units): -> (indices per row, W). The reference pads a packed micro-batch's tokens to a multiple of
    data_pad_size_multiplier; padding every row to a multiple of it would cost up to that many slots per row."""
    base, least = max(lengths), padded_to(sum(lengths), multiple)  # no layout holds fewer slots than ``least``
    best: tuple[int, list[list[int]], int] | None = None
    for width in range(base, base + multiple):
        rows = pack_rows(lengths, width)
        total = padded_to(len(rows), multiple // math.gcd(width, multiple)) * width
        if best is None or total < best[0]:
            best = (total, rows, width)
        if total == least:  # a later width can only tie (the first of the least is kept)
            break
    total, rows, width = best
    return rows + [[] for _ in range(total // width - len(rows))], width


def pad_columns(batch: TokenBatch, multiple: int, rows_share: bool = False) -> TokenBatch:
    """The batch with its sequences [N, L] right-padded (mask 0) to L a multiple of ``multiple`` (``rows_share``: to
    N x L a multiple of it, padded_width)."""
    L = batch.input_ids.shape[1]
    extra = (padded_width(L, len(batch), multiple) if rows_share else padded_to(L, multiple)) - L
    if not extra:
        return batch
    pad = lambda t: torch.nn.functional.pad(t, (0, extra))  # noqa: E731
    return TokenBatch(pad(batch.input_ids), pad(batch.attention_mask), batch.resp_index, batch.resp_tokens,
                      batch.loss_mask, batch.rollout_log_probs)


def response_logits(model, batch: TokenBatch, pad_to: int = 1) -> torch.Tensor:
    """[N, T, V] logits at the positions predicting the response tokens; the packed rows (or the padded sequences)
    hold a multiple of ``pad_to`` tokens together (data_pad_size_multiplier, as the reference pads a packed
    micro-batch: padded_width; the extra slots are empty, so no number changes).

    Packed (PACKABLE_MODEL_TYPES): samples sharing a prompt form one unit, [prompt][response 1]...[response G],
    where each response sees the prompt and itself only (position ids continue from the prompt), so a
    group's prompt is computed once instead of G times; units are packed into rows by first-fit decreasing
    (block-diagonal mask, no padding between them) and the LM head runs only at the response positions.
    Exact: every token sees the same context at the same positions as in the padded forward, so the
    numbers agree up to float rounding and the shared prompt's gradient is the sum of the G copies'
    (tests/training/test_batch.py). Other model types: the padded forward."""
    if not packable(model):
        return at_response(forward(model, pad_columns(batch, pad_to, rows_share=True)).logits, batch)
    N, T = batch.resp_index.shape
    lengths = batch.attention_mask.sum(-1).tolist()  # [N]
    units, plen = prompt_units(batch)
    unit_len = [plen[m[0]] + sum(lengths[i] - plen[i] for i in m) for m in units]
    rows, W = padded_layout(unit_len, pad_to)  # empty slots after the units (and empty rows): each one a unit of its own
    tokens, first_pos = batch.input_ids.tolist(), batch.resp_index.clamp(min=0).tolist()  # [N, L], [N, T]
    ids = [[0] * W for _ in rows]  # [R, W]
    pos = [[0] * W for _ in rows]  # [R, W] position ids, as in each sample's own sequence
    seg = [[-1 - w for w in range(W)] for _ in rows]  # [R, W] unit of each slot (empty slots: a unit of their own)
    sub = [[-2] * W for _ in rows]  # [R, W] -1 = prompt, i = sample i's response
    r_idx, c_idx = [[0] * T for _ in range(N)], first_pos  # [N, T] row and column of each response position
    spans = [[] for _ in rows]  # [R] each unit's (start, end) columns in its row
    for r, members in enumerate(rows):
        o = 0
        for u in members:
            first, p = units[u][0], plen[units[u][0]]
            ids[r][o : o + p], pos[r][o : o + p], sub[r][o : o + p] = tokens[first][:p], range(p), [-1] * p
            seg[r][o : o + unit_len[u]] = [u] * unit_len[u]
            spans[r].append((o, o + unit_len[u]))
            start = o + p
            for i in units[u]:
                t = lengths[i] - p
                ids[r][start : start + t], pos[r][start : start + t], sub[r][start : start + t] = tokens[i][p : p + t], range(p, p + t), [i] * t
                c_idx[i] = [o + q if q < p else start + q - p for q in c_idx[i]]  # q: position in sample i's own sequence
                r_idx[i] = [r] * T
                start += t
            o += unit_len[u]
    from .unit_attention import worth_it

    if not worth_it(model, unit_len, len(rows), W):  # attention per unit where it pays (training/unit_attention.py)
        spans = None
    ids, pos, seg, sub, r_idx, c_idx = (torch.tensor(x, dtype=torch.long) for x in (ids, pos, seg, sub, r_idx, c_idx))
    causal = torch.ones((W, W), dtype=torch.bool).tril()
    own = (sub[:, None, :] == -1) | (sub[:, None, :] == sub[:, :, None])  # [R, W, W] key is prompt, or the query's own tokens
    mask = (seg[:, :, None] == seg[:, None, :]) & causal & own  # [R, W(query), W(key)]
    device = batch.input_ids.device
    head = getattr(model, PACKED_FORWARD, None) or (lambda *a: packed_logits(model, *a))
    return head(ids.to(device), mask[:, None].to(device), pos.to(device), r_idx.to(device), c_idx.to(device), spans)  # [N, T, V]


# Under FSDP2 the model carries packed_logits as this method, registered as a forward of its root unit
# (data_parallel.fully_shard_model), so the call gathers the root's parameters as ``forward`` does.
PACKED_FORWARD = "miles_packed_logits"


def packed_logits(model, ids, mask, pos, rows, cols, spans=None) -> torch.Tensor:
    """lm_head(base_model(packed rows)) at [rows, cols]: ids, pos [R, W], mask [R, 1, W, W], rows, cols [N, T] -> [N, T, V];
    ``spans``: per row, each unit's (start, end) columns, for attention per unit (training/unit_attention.py)."""
    if spans is None:
        hidden = model.base_model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).last_hidden_state  # [R, W, H]
    else:
        from .unit_attention import units_attention

        with units_attention(model):
            hidden = model.base_model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                                      miles_units=spans).last_hidden_state
    return lm_head(model.get_output_embeddings(), hidden[rows, cols])  # by vocabulary chunks on the CPU (models/lm_head.py)


def response_log_probs(model, batch: TokenBatch, temperature: float, with_entropy: bool, entropy_grad: bool = True,
                       chunk_size: int = -1, pad_to: int = 1):
    """-> (log-probs [N, T] of the response tokens under log_softmax(logits / T), entropy [N, T] or None).

    ``entropy_grad=False``: the entropy is only a metric (entropy_coef 0), computed outside autograd.
    ``chunk_size`` > 0 (log_probs_chunk_size, without entropy): the float32 logits / T and their log_softmax are made
    ``chunk_size`` response positions at a time, so the pass holds [N, chunk_size, V] of them instead of [N, T, V].
    ``pad_to``: response_logits'."""
    from miles_core.algorithms.ops import entropy_from_log_probs

    if chunk_size > 0 and not with_entropy:
        raw = response_logits(model, batch, pad_to)  # [N, T, V] in the model's dtype
        return torch.cat([torch.log_softmax(raw[:, s : s + chunk_size].float() / temperature, dim=-1)
                          .gather(-1, batch.resp_tokens[:, s : s + chunk_size, None]).squeeze(-1)
                          for s in range(0, raw.shape[1], chunk_size)], dim=1), None  # [N, T]
    resp_logits = response_logits(model, batch, pad_to).float()  # [N, T, V]
    if temperature != 1.0:  # x / 1.0 is x: a pass over [N, T, V] (and its backward) saved
        resp_logits = resp_logits / temperature
    logp_all = torch.log_softmax(resp_logits, dim=-1)
    logp = logp_all.gather(-1, batch.resp_tokens[..., None]).squeeze(-1)  # [N, T]
    entropy = None
    if with_entropy:  # entropy_from_logits of the same logits, from this log_softmax instead of a second one
        entropy = entropy_from_log_probs(logp_all if entropy_grad else logp_all.detach())
    return logp, entropy

"""training/unit_attention.py: attention per packed unit gives the full-row SDPA's log-probs and gradients (float
rounding only), runs one SDPA per unit and layer, and is chosen only where it saves scores."""

from __future__ import annotations

import random

import pytest
import torch

from miles_core.data.sample import Sample, Status
from miles_core.training import unit_attention
from miles_core.training.batch import make_batch, response_logits

from .conftest import VOCAB, tiny_lm


def _groups(n_groups: int, prompt: int, responses: tuple[int, int], seed: int = 3) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for g in range(n_groups):
        p = [rng.randrange(2, VOCAB) for _ in range(prompt)]
        for k in range(4):
            r = [rng.randrange(2, VOCAB) for _ in range(rng.randint(*responses))]
            out.append(Sample(group_index=g, index=4 * g + k, tokens=p + r, response_length=len(r), loss_mask=[1] * len(r),
                              rollout_log_probs=[-1.0] * len(r), reward=float(k % 2), status=Status.COMPLETED,
                              weight_versions=[1]))
    return out


def test_per_unit_attention_equals_the_full_row_with_gradients(monkeypatch):
    model = tiny_lm()
    assert model.config._attn_implementation == "sdpa"
    batch = make_batch(_groups(4, 20, (3, 6)), pad_id=0)  # 4 units of 32-44 tokens: rows of 128 hold three, then one
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    out = []
    for units in (True, False):
        monkeypatch.setattr(unit_attention, "worth_it", lambda *a: units)
        model.zero_grad()
        calls.clear()
        logits = response_logits(model, batch, pad_to=128)
        out.append((len(calls), logits.detach()))
        logp = torch.log_softmax(logits, -1).gather(-1, batch.resp_tokens[..., None]).squeeze(-1)
        (logp * batch.loss_mask).sum().backward()
        out[-1] += ([p.grad.clone() for p in model.parameters()],)
    (n_units, a, ga), (n_rows, b, gb) = out
    assert (n_units, n_rows) == (4 * 2, 2)  # one SDPA per unit and layer, against one per layer
    assert model.config._attn_implementation == "sdpa"  # restored after the forward
    mask = batch.loss_mask.bool()
    assert (a - b)[mask].abs().max() < 1e-5
    for x, y in zip(ga, gb):
        assert (x - y).abs().max() <= 1e-5 * max(1.0, float(y.abs().max()))


@pytest.mark.parametrize("lengths, rows, width, expected", [
    ([128, 128, 128, 128], 2, 256, True),  # SmolLM2 4x4x32: two units a row, half the scores
    ([120, 110], 1, 256, True),
    ([130, 126], 1, 256, False),  # a full row: under half of its scores saved
    ([200], 1, 256, False),  # one unit: nothing saved
    ([34] * 8, 2, 136, True),  # the tiny model's units: a quarter of the scores
    ([100, 30], 1, 130, False),  # one unit fills most of the row
])
def test_worth_it_where_it_saves_scores(lengths, rows, width, expected):
    assert unit_attention.worth_it(tiny_lm(), lengths, rows, width) is expected


def test_other_attention_implementations_and_compiled_layers_keep_their_attention():
    model = tiny_lm()
    assert unit_attention.worth_it(model, [128, 128], 1, 256)
    model.miles_compiled_layers = True  # torch_compile's layers: spans changing every step would recompile them
    assert not unit_attention.worth_it(model, [128, 128], 1, 256)
    model = tiny_lm()
    model.config._attn_implementation = "eager"
    assert not unit_attention.worth_it(model, [128, 128], 1, 256)

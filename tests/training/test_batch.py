"""response_logits packs the sequences into rows and runs the LM head only at the response: same numbers as the padded forward."""

from __future__ import annotations

import math

import torch

from miles_core.training.batch import at_response, forward, make_batch, pack_rows, response_log_probs, response_logits


def test_response_logits_equal_the_full_forward_at_the_response(lm, samples):
    model = lm()
    batch = make_batch(samples, pad_id=0)
    with torch.no_grad():
        full = at_response(forward(model, batch).logits, batch)  # [N, T, V]
        kept = response_logits(model, batch)
    mask = batch.loss_mask.bool()
    assert kept.shape == full.shape
    assert (kept - full)[mask].abs().max() < 1e-5
    logp, entropy = response_log_probs(model, batch, 0.7, with_entropy=True, entropy_grad=False)
    ref = torch.log_softmax(full.float() / 0.7, -1).gather(-1, batch.resp_tokens[..., None]).squeeze(-1)
    assert (logp - ref)[mask].abs().max() < 1e-5 and not entropy.requires_grad


def test_pack_rows_first_fit_decreasing():
    assert pack_rows([5, 3, 2, 8, 4], 8) == [[3], [0, 1], [4, 2]]
    assert sorted(sum(pack_rows([1] * 7, 3), [])) == list(range(7))


def test_packed_response_logits_equal_the_padded_forward_with_gradients(lm, samples, sample_factory):
    """Packed rows (block-diagonal mask, per-sequence positions) vs the right-padded forward: same log-probs
    and the same gradients (fp32 rounding only)."""
    samples = samples + sample_factory(3, 2, seed=5)
    model = lm()
    batch = make_batch(samples, pad_id=0)
    assert len(pack_rows(batch.attention_mask.sum(-1).tolist(), batch.input_ids.shape[1])) < len(samples)
    mask = batch.loss_mask.bool()
    grads = []
    for packed in (True, False):
        model.zero_grad()
        logits = response_logits(model, batch) if packed else at_response(forward(model, batch).logits, batch)
        logp = torch.log_softmax(logits.float(), -1).gather(-1, batch.resp_tokens[..., None]).squeeze(-1)
        (logp * batch.loss_mask).sum().backward()
        grads.append((logp.detach(), [p.grad.clone() for p in model.parameters()]))
    (lp1, g1), (lp2, g2) = grads
    assert (lp1 - lp2)[mask].abs().max() < 1e-5
    for a, b in zip(g1, g2):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, float(b.abs().max()))


def test_a_groups_prompt_is_computed_once(lm, samples):
    """make_samples' groups share their prompt: 2 units, so the packed rows hold each prompt once."""
    from miles_core.training.batch import prompt_units

    batch = make_batch(samples, pad_id=0)
    units, plen = prompt_units(batch)
    assert units == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [plen[i] + s.response_length for i, s in enumerate(samples)] == [len(s.tokens) for s in samples]


def test_data_pad_size_multiplier_widens_the_packed_rows_and_changes_no_logit(lm, samples):
    """pad_to 64: the packed rows together hold a multiple of 64 slots, less than 64 more than the unpadded layout (the
    reference pads a packed micro-batch's tokens, not each row: batch.padded_layout), the logits equal the unpadded
    ones; the padded forward of a model that is not packed pads its sequences' columns until they hold a multiple."""
    from miles_core.training.batch import PACKED_FORWARD, packed_logits

    model, batch = lm(), make_batch(samples, pad_id=0)
    shapes = []

    def seen(ids, mask, pos, rows, cols, spans):
        shapes.append(tuple(ids.shape))
        return packed_logits(model, ids, mask, pos, rows, cols, spans)

    setattr(model, PACKED_FORWARD, seen)
    plain, padded = response_logits(model, batch), response_logits(model, batch, pad_to=64)
    (rows, width), (rows_padded, width_padded) = shapes
    assert (rows * width) % 64 and (rows_padded * width_padded) % 64 == 0
    assert rows * width < rows_padded * width_padded < rows * width + 64
    torch.testing.assert_close(padded, plain, rtol=1e-5, atol=1e-6)
    model.config.use_sliding_window = True  # not packable: the padded forward, its sequences padded to 64 columns
    lengths = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: lengths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    torch.testing.assert_close(response_logits(model, batch, pad_to=64), plain, rtol=1e-5, atol=1e-6)
    hook.remove()
    assert len(lengths) == 1 and (len(batch) * lengths[0]) % 64 == 0 and lengths[0] < batch.input_ids.shape[1] + 64 // math.gcd(len(batch), 64)


def test_karmarkar_karp_balances_the_sums():
    from miles_core.training.batch import karmarkar_karp

    # largest differencing on 8, 7, 6, 5, 4: 8-7 -> 1; 6-5 -> 1; 4-1 -> 3; 3-1 -> 2: sums 16 and 14
    parts = karmarkar_karp([8, 7, 6, 5, 4], 2)
    sums = sorted(sum([8, 7, 6, 5, 4][i] for i in p) for p in parts)
    assert sums == [14, 16] and sorted(i for p in parts for i in p) == [0, 1, 2, 3, 4]
    three = karmarkar_karp([5, 5, 5, 5, 5, 5], 3)
    assert sorted(len(p) for p in three) == [2, 2, 2]
    assert karmarkar_karp([9, 1], 3) == [[0], [1]]  # more groups than items: the empty ones dropped


def test_padded_layout_holds_a_multiple_with_little_waste():
    """Rows x width a multiple of the multiplier whatever the units, every unit in exactly one row that fits it, and
    never more slots than padding each row of the unpadded layout to a multiple (the layout this replaces)."""
    import random

    from miles_core.training.batch import padded_layout, padded_to

    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.randint(1, 300) for _ in range(rng.randint(1, 40))]
        multiple = rng.choice([1, 8, 64, 128])
        rows, width = padded_layout(lengths, multiple)
        assert (len(rows) * width) % multiple == 0 and width >= max(lengths)
        assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
        assert all(sum(lengths[i] for i in r) <= width for r in rows)
        plain = pack_rows(lengths, max(lengths))
        assert len(rows) * width <= len(plain) * padded_to(max(lengths), multiple)
        if multiple == 1:
            assert rows == plain and width == max(lengths)

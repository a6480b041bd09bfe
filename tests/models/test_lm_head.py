"""models/lm_head.py: the LM head by vocabulary chunks equals the module's own product (values and gradients, up
to float rounding), and is used only where it was measured (a plain fp32 Linear on the CPU, no autocast)."""

from __future__ import annotations

import pytest
import torch

from miles_core.models import lm_head as module
from miles_core.models.lm_head import CHUNK, lm_head


def _head(vocab: int, hidden: int = 24, bias: bool = False) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(hidden, vocab, bias=bias)


@pytest.mark.parametrize("vocab", [CHUNK + 1, 2 * CHUNK, 3 * CHUNK + 7])
def test_chunked_head_equals_the_module_in_values_and_gradients(vocab):
    head = _head(vocab)
    x = torch.randn(3, 5, 24, requires_grad=True)
    g = torch.randn(3, 5, vocab)
    ours = lm_head(head, x)
    (ours * g).sum().backward()
    dx, dw = x.grad.clone(), head.weight.grad.clone()
    x.grad, head.weight.grad = None, None
    ref = head(x)
    (ref * g).sum().backward()
    assert ours.shape == ref.shape == (3, 5, vocab)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx, x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw, head.weight.grad, rtol=1e-5, atol=1e-5)
    assert type(ours.grad_fn.next_functions[0][0]).__name__ == "_ChunkedLinearBackward"  # the chunked path ran


def test_gradient_reaches_a_tied_embedding_through_both_uses():
    head = _head(CHUNK + 5)
    emb = torch.nn.Embedding(CHUNK + 5, 24)
    emb.weight = head.weight  # tied, as SmolLM2 and Qwen2's small models
    ids = torch.tensor([[1, 7, CHUNK + 2]])
    lm_head(head, emb(ids)).logsumexp(-1).sum().backward()
    ours = head.weight.grad.clone()
    head.weight.grad = None
    head(emb(ids)).logsumexp(-1).sum().backward()
    torch.testing.assert_close(ours, head.weight.grad, rtol=1e-5, atol=1e-6)


def test_no_grad_forward_builds_no_graph_and_small_or_wrapped_heads_call_the_module(monkeypatch):
    head = _head(CHUNK + 1)
    with torch.no_grad():
        out = lm_head(head, torch.randn(2, 24))
    assert out.grad_fn is None and out.shape == (2, CHUNK + 1)
    calls = []
    monkeypatch.setattr(module, "_forward", lambda x, w: calls.append(1) or x @ w.t())
    for other, x in [(_head(CHUNK), torch.randn(2, 24)),  # one chunk: nothing to split
                     (_head(CHUNK + 1, bias=True), torch.randn(2, 24)),
                     (_head(CHUNK + 1).double(), torch.randn(2, 24, dtype=torch.float64))]:
        with torch.no_grad():
            torch.testing.assert_close(lm_head(other, x), other(x))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert lm_head(head, torch.randn(2, 24)).dtype == torch.bfloat16  # the module under autocast
    assert calls == []

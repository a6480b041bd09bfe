"""Small pure pieces of the flows and tracking layers."""

from __future__ import annotations

from flows.train import due
from miles_core.tracking import flatten, prefix_collisions, sanitize_key


def test_periodic_rule():
    # interval k runs after rollout i when (i+1) % k == 0, or i is the last rollout
    assert [i for i in range(7) if due(3, i, 7)] == [2, 5, 6]
    assert not any(due(None, i, 7) for i in range(7))


def test_sanitize_and_flatten():
    assert sanitize_key("eval/arith-pass@4") == "eval/arith-pass_4"
    assert flatten({"a": {"b": 1, "c": {"d": 2}}, "e": {}}) == {"a.b": 1, "a.c.d": 2, "e": {}}
    assert prefix_collisions(["eval/x", "eval/x/y", "eval/x-z"]) == [("eval/x", "eval/x/y")]

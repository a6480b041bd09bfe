"""The grading corpus (rewards_corpus.py) through the public ``score`` helper."""

from __future__ import annotations

import pytest
from rewards_corpus import cases

from miles_core.rewards import reward_value, score

CASES = cases()


def test_corpus_is_large_enough():
    assert len(CASES) >= 150
    assert {row[0] for row in CASES} >= {"math", "deepscaler", "gemma_math", "dapo", "f1", "gpqa"}


@pytest.mark.parametrize(
    ("rm_type", "response", "label", "metadata", "expected"),
    [row[:5] for row in CASES],
    ids=[f"{i}-{row[0]}-{row[5]}" for i, row in enumerate(CASES)],
)
def test_corpus(rm_type, response, label, metadata, expected):
    reward = score(rm_type, response, label, metadata)
    value = reward_value(reward, "score" if isinstance(reward, dict) else None)
    assert value == pytest.approx(expected, abs=1e-9)

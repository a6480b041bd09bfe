"""math: 1.0 when the last ``\\boxed{...}`` of the response is equivalent to the label, else 0.0.

Rule (REFERENCE §4): the answer is the content of the response's last ``\\boxed{...}`` or
``\\fbox{...}`` (none, or unbalanced -> 0); a label containing ``\\boxed`` is reduced to its own
boxed content; equivalence is :func:`miles_core.rewards.math_equal.answers_match` (normalized
strings, exact numbers, tuples, then sympy under a time limit).
Example: response ``"... so the answer is \\boxed{\\dfrac12}"``, label ``"0.5"`` -> 1.0.
"""

from __future__ import annotations

from typing import Any

from miles_core.data.sample import Sample
from miles_core.rewards._text import as_text, label_text, last_boxed
from miles_core.rewards.math_equal import answers_match


def grade_boxed(response: str, label: Any) -> float:
    """1.0 when the last boxed answer of ``response`` matches ``label``, else 0.0."""
    pred = last_boxed(response)
    gold = label_text(label)
    if pred is None or gold is None:
        return 0.0
    if "\\boxed" in gold or "\\fbox" in gold:
        gold = last_boxed(gold)
        if gold is None:
            return 0.0
    return 1.0 if answers_match(pred, gold) else 0.0


def math_reward(sample: Sample) -> float:
    """The ``math`` family: grade the whole response."""
    return grade_boxed(as_text(sample.response), sample.label)

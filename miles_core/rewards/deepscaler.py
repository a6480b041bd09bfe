"""deepscaler: the math rule applied only to the text after the reasoning.

Rule (REFERENCE §4): grade only the text after the last ``</think>``, or, when there is none,
after the last ``###Response``; with neither marker the reward is 0.0. The graded text must
contain a ``\\boxed{...}`` answer, as in ``math``.
Example: ``"<think>maybe \\boxed{3}</think> The answer is \\boxed{4}"``, label ``"4"`` -> 1.0.
"""

from __future__ import annotations

from miles_core.data.sample import Sample
from miles_core.rewards._text import as_text
from miles_core.rewards.math_rm import grade_boxed

MARKERS = ("</think>", "###Response")


def answer_part(response: str) -> str | None:
    """Text after the last ``</think>`` (else after the last ``###Response``); None if neither."""
    for marker in MARKERS:
        idx = response.rfind(marker)
        if idx >= 0:
            return response[idx + len(marker) :]
    return None


def deepscaler_reward(sample: Sample) -> float:
    tail = answer_part(as_text(sample.response))
    return 0.0 if tail is None else grade_boxed(tail, sample.label)

"""gemma_math: the math rule applied to the text after the last ``<channel|>`` marker.

Rule (REFERENCE §4): when the response contains ``<channel|>``, only the text after its last
occurrence is graded; without the marker the whole response is graded (our reading of
"otherwise as math"). The graded text must contain a ``\\boxed{...}`` answer, as in ``math``.
Example: ``"thinking \\boxed{1}<channel|>final: \\boxed{2}"``, label ``"2"`` -> 1.0.
"""

from __future__ import annotations

from miles_core.data.sample import Sample
from miles_core.rewards._text import as_text
from miles_core.rewards.math_rm import grade_boxed

MARKER = "<channel|>"


def gemma_math_reward(sample: Sample) -> float:
    response = as_text(sample.response)
    idx = response.rfind(MARKER)
    tail = response if idx < 0 else response[idx + len(MARKER) :]
    return grade_boxed(tail, sample.label)

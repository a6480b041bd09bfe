"""dapo: the DAPO math reward, a dict ``{score: 1.0 | -1.0, acc: bool, pred: str}``.

Rule (REFERENCE §4): look only at the last 300 characters of the response, take the last
``Answer: ...`` line (case-insensitive ``answer``, up to the end of the line), and compare it
to the label (a boxed label is reduced to its boxed content) with the shared math equivalence
**without sympy** (normalized strings, exact numbers, tuples), as DAPO's strict matching does.
``pred`` is the normalized prediction (``""`` when there is no ``Answer:`` line). Malformed
input gives ``{score: -1.0, acc: False, pred: ""}``. Train with ``reward_key: score``.
Example: ``"... Answer: 1,000"``, label ``"1000"`` -> ``{score: 1.0, acc: True, pred: "1000"}``.
"""

from __future__ import annotations

import re
from typing import Any

from miles_core.data.sample import Sample
from miles_core.rewards._text import as_text, label_text, last_boxed
from miles_core.rewards.math_equal import answers_match
from miles_core.rewards.math_normalize import normalize_answer

TAIL_CHARS = 300
_ANSWER_RE = re.compile(r"(?i:answer)\s*:\s*([^\n]+)")


def dapo_grade(response: str, label: Any) -> dict[str, Any]:
    """The DAPO dict for one response (see the module rule)."""
    matches = _ANSWER_RE.findall(response[-TAIL_CHARS:])
    raw = matches[-1].strip() if matches else ""
    gold = label_text(label)
    if gold is not None and ("\\boxed" in gold or "\\fbox" in gold):
        gold = last_boxed(gold)
    acc = bool(raw) and gold is not None and answers_match(raw, gold, sympy_timeout=None)
    return {"score": 1.0 if acc else -1.0, "acc": acc, "pred": normalize_answer(raw)}


def dapo_reward(sample: Sample) -> dict[str, Any]:
    return dapo_grade(as_text(sample.response), sample.label)

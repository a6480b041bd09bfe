"""gpqa: 1.0 when the multiple-choice letter extracted from the response is the label's letter.

Rule (REFERENCE §4). Valid letters come from ``metadata["choices"]``: a list of option texts
gives ``A, B, ...`` by position, a dict gives its single-letter keys; without choices the letters
are ``A``-``D``. The label is a letter (``"C"``, ``"(c)"``) or the text of one of the choices.
The predicted letter is the first that succeeds of: the last ``answer is X`` / ``answer: X`` /
``final answer: X`` (decorations such as ``**``, ``(``, ``$``, ``\\boxed{``, ``\\text{`` allowed),
the last ``\\boxed{X}``, the last standalone capital valid letter. Letters outside the valid set
are ignored. Example: ``"... so the answer is (B)."``, label ``"B"`` -> 1.0.
"""

from __future__ import annotations

import re
import string
from typing import Any

from miles_core.data.sample import Sample
from miles_core.rewards._text import as_text, last_boxed

DEFAULT_LETTERS = "ABCD"
_ANSWER_RE = re.compile(
    r"(?i:answer)\s*(?i:is|:|is:)\s*[\s*($\[]*(?:\\boxed\{|\\text\{|\\textbf\{)?\s*\(?([A-Z])(?![A-Za-z])"
)
_STANDALONE_RE = re.compile(r"(?<![A-Za-z])([A-Z])(?![A-Za-z'])")


def valid_letters(metadata: dict[str, Any]) -> str:
    """The answer letters this question accepts (see the module rule)."""
    choices = metadata.get("choices")
    if isinstance(choices, (list, tuple)) and 0 < len(choices) <= 26:
        return string.ascii_uppercase[: len(choices)]
    if isinstance(choices, dict):
        keys = sorted(k.upper() for k in choices if isinstance(k, str) and len(k) == 1)
        return "".join(k for k in keys if k.isalpha()) or DEFAULT_LETTERS
    return DEFAULT_LETTERS


def label_letter(label: Any, metadata: dict[str, Any], letters: str) -> str | None:
    """The label's letter: a letter itself, or the text of one of the choices."""
    if not isinstance(label, str):
        return None
    bare = label.strip().strip("()").strip().upper()
    if len(bare) == 1 and bare in letters:
        return bare
    choices = metadata.get("choices")
    if isinstance(choices, (list, tuple)):
        for letter, text in zip(letters, choices):
            if isinstance(text, str) and text.strip() == label.strip():
                return letter
    if isinstance(choices, dict):
        for key, text in choices.items():
            if isinstance(text, str) and text.strip() == label.strip() and str(key).upper() in letters:
                return str(key).upper()
    return None


def extract_letter(response: str, letters: str) -> str | None:
    """The predicted letter of ``response`` (see the module rule), or None."""
    picks = [m for m in _ANSWER_RE.findall(response) if m in letters]
    if picks:
        return picks[-1]
    boxed = (last_boxed(response) or "").strip().strip("()").strip()
    if len(boxed) == 1 and boxed.upper() in letters:
        return boxed.upper()
    standalone = [m for m in _STANDALONE_RE.findall(response) if m in letters]
    return standalone[-1] if standalone else None


def gpqa_reward(sample: Sample) -> float:
    metadata = sample.metadata or {}
    letters = valid_letters(metadata)
    gold = label_letter(sample.label, metadata, letters)
    pred = extract_letter(as_text(sample.response), letters)
    return 1.0 if gold is not None and pred == gold else 0.0

"""f1: SQuAD token-level F1 between the response and the label (best over several labels).

Rule (REFERENCE §4, SQuAD v1.1 evaluation): normalize both texts (lowercase, drop punctuation,
drop the articles a/an/the, collapse whitespace), split on whitespace, then
``F1 = 2 P R / (P + R)`` with ``P = common / len(pred)``, ``R = common / len(gold)`` and
``common`` the size of the token multiset intersection. The label may be a string (or number) or a list
of them (the maximum F1 counts). Departure from SQuAD: an empty (normalized) prediction or gold
scores 0.0 instead of 1.0 when both are empty. The whole response is graded; use ``boxed_f1``
to grade only the last boxed answer.
Example: response ``"The Eiffel Tower"``, label ``"Eiffel tower in Paris"`` -> P=1, R=2/4, F1=2/3.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

from miles_core.data.sample import Sample
from miles_core.rewards._text import as_text, label_text

_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def squad_normalize(text: str) -> str:
    """Lowercase, drop punctuation and articles, collapse whitespace."""
    text = text.lower().translate(_PUNCT)
    return " ".join(_ARTICLES_RE.sub(" ", text).split())


def token_f1(pred: str, gold: str) -> float:
    """SQuAD token F1 of one prediction against one gold answer."""
    pred_tokens, gold_tokens = squad_normalize(pred).split(), squad_normalize(gold).split()
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _golds(label: Any) -> list[str]:
    if isinstance(label, (list, tuple)):
        return [g for g in map(label_text, label) if g is not None]
    gold = label_text(label)
    return [] if gold is None else [gold]


def f1_reward(sample: Sample) -> float:
    pred = as_text(sample.response)
    return max((token_f1(pred, gold) for gold in _golds(sample.label)), default=0.0)

"""random and deterministic_random: 0.0/1.0 rewards for plumbing tests and baselines.

Rules (REFERENCE §4): ``random`` is 0.0 or 1.0 with probability 1/2 each (Python's ``random``
module, so ``random.seed`` makes it reproducible). ``deterministic_random`` is
``int(sha256(json([tokens, response])), 16) % 2``: stable across processes and runs (unlike
``hash()``, which is salted per process), so the same sample always gets the same reward.
Example: tokens ``[1, 2, 3]``, response ``"hi"`` -> the same 0.0 or 1.0 everywhere.
"""

from __future__ import annotations

import hashlib
import json
import random

from miles_core.data.sample import Sample
from miles_core.rewards._text import as_text


def random_reward(sample: Sample) -> float:
    return float(random.getrandbits(1))


def stable_bit(tokens: list[int], response: str) -> int:
    """``sha256`` of the JSON pair ``[tokens, response]``, as an integer, mod 2."""
    payload = json.dumps([[int(t) for t in tokens], response], separators=(",", ":"))
    return int(hashlib.sha256(payload.encode("utf-8")).hexdigest(), 16) % 2


def deterministic_random_reward(sample: Sample) -> float:
    return float(stable_bit(list(sample.tokens or []), as_text(sample.response)))

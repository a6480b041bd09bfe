"""Helpers shared by the HTTP engine tests (imported by name: conftest puts this dir on sys.path).

No __init__.py here: this directory is named ``http``, and as a package it would shadow the
standard library's ``http`` (torch imports http.client) under pytest's importlib mode.
"""

from __future__ import annotations

from miles_core.rollout.protocol import GenerateRequest, SamplingParams


def requests_for(n: int = 6, max_new_tokens: int = 8, **params) -> list[GenerateRequest]:
    """n requests with prompts of different lengths (3..3+n-1 tokens)."""
    sp = SamplingParams(max_new_tokens=max_new_tokens, **params)
    return [GenerateRequest([5 + (i * 7 + j) % 200 for j in range(3 + i)], sp) for i in range(n)]


def same_results(a, b) -> bool:
    """Bit-identical token ids, log-probs, finish reasons and versions."""
    key = lambda r: (r.output_ids, r.output_log_probs, r.finish_reason, r.weight_version, r.prompt_tokens)
    return [key(r) for r in a] == [key(r) for r in b]

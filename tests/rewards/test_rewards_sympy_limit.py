"""Sympy runs under a hard time limit: a pathological answer scores 0 quickly, the pool survives."""

from __future__ import annotations

import time

from miles_core.rewards import score
from miles_core.rewards.math_equal import DEFAULT_SYMPY_TIMEOUT_S, answers_match
from miles_core.rewards.sympy_pool import SympyPool

TOWER = r"9^{9^{9^{9}}}"  # evaluating this integer would take longer than the universe has


def test_pathological_answer_scores_zero_within_the_time_limit(warm_sympy):
    start = time.monotonic()
    assert score("math", rf"\boxed{{{TOWER}}}", "1") == 0.0
    elapsed = time.monotonic() - start
    assert elapsed < DEFAULT_SYMPY_TIMEOUT_S + 1.5, f"took {elapsed:.2f}s"
    # the killed worker was replaced: sympy still answers afterwards
    assert score("math", r"\boxed{2\sqrt{2}}", r"\sqrt{8}") == 1.0


def test_a_private_pool_with_a_short_timeout():
    pool = SympyPool(size=1)
    try:
        pool.warm()
        start = time.monotonic()
        assert not answers_match(TOWER, "1", sympy_timeout=0.5, pool=lambda: pool)
        assert time.monotonic() - start < 1.5
        assert answers_match("x^2-1", "(x-1)(x+1)", sympy_timeout=30, pool=lambda: pool)
    finally:
        pool.close()


def test_sympy_can_be_switched_off():
    assert not answers_match(r"2\sqrt{2}", r"\sqrt{8}", sympy_timeout=None)
    assert answers_match(r"\frac{1}{2}", "0.5", sympy_timeout=None)

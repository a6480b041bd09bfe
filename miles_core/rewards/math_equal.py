"""Equivalence of two extracted math answers (shared by math, deepscaler, gemma_math and dapo).

Rule, first match wins (both sides go through :func:`normalize_answer` first; an empty side is
never equal):
1. the normalized strings are equal (single words also case-insensitively: ``Yes`` == ``yes``);
2. both are exact numbers (:func:`to_number`) and equal: ``0.5`` == ``1/2`` == ``\\frac{1}{2}``;
   when exactly one side carried a percent sign, ``50\\%`` also equals ``0.5``;
3. both are tuples/intervals/sets with the same brackets and length: equal element-wise
   (a bare list ``2, -3`` without brackets, up to 8 items, may match in any order);
4. ``sympy_timeout`` is not None and sympy shows them equal within that many seconds, in a
   worker process (:mod:`miles_core.rewards.sympy_pool`); a timeout counts as "not equal".
"""

from __future__ import annotations

from collections.abc import Callable

from miles_core.rewards.math_latex import latex_to_expr
from miles_core.rewards.math_normalize import has_percent, normalize_answer, split_tuple, to_number
from miles_core.rewards.sympy_pool import SympyPool, default_pool

DEFAULT_SYMPY_TIMEOUT_S = 2.0


def answers_match(
    pred: str,
    label: str,
    sympy_timeout: float | None = DEFAULT_SYMPY_TIMEOUT_S,
    pool: Callable[[], SympyPool] = default_pool,
) -> bool:
    """Whether the extracted answer ``pred`` is equivalent to ``label`` (see the module rule)."""
    p, l = normalize_answer(pred), normalize_answer(label)
    if not p or not l:
        return False
    percent = has_percent(pred) != has_percent(label)
    return _match(p, l, percent, sympy_timeout, pool)


def _match(p: str, l: str, percent: bool, timeout: float | None, pool) -> bool:
    if p == l or (p.isalpha() and len(p) > 1 and p.lower() == l.lower()):
        return True
    x, y = to_number(p), to_number(l)
    if x is not None and y is not None:
        return x == y or (percent and (x == y / 100 or y == x / 100))
    p_items, l_items = split_tuple(p), split_tuple(l)
    if p_items is not None or l_items is not None:
        return _tuples_match(p_items, l_items, timeout, pool)
    if timeout is None:
        return False
    a, b = latex_to_expr(p), latex_to_expr(l)
    return a is not None and b is not None and pool().equal(a, b, timeout)


def _tuples_match(p_items, l_items, timeout: float | None, pool) -> bool:
    if p_items is None or l_items is None:
        return False
    (p_br, ps), (l_br, ls) = p_items, l_items
    if p_br != l_br or len(ps) != len(ls):
        return False
    if p_br or len(ps) > 8:
        return all(_match(a, b, False, timeout, pool) for a, b in zip(ps, ls))
    remaining = list(ls)
    for a in ps:  # bare list: any order, each label element used once
        hit = next((i for i, b in enumerate(remaining) if _match(a, b, False, timeout, pool)), None)
        if hit is None:
            return False
        remaining.pop(hit)
    return True

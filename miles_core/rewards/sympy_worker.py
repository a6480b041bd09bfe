"""The sympy worker process: reads ``[a, b]`` JSON lines on stdin, answers ``1``/``0`` lines.

Run as ``python -m miles_core.rewards.sympy_worker`` by :mod:`miles_core.rewards.sympy_pool`.
Rule: ``a`` and ``b`` (strings from :func:`miles_core.rewards.math_latex.latex_to_expr`) are
equal when, after parsing in a namespace that holds only a few sympy names and no builtins,
``x == y``; or, with no free symbols, ``|N(x - y)| <= 1e-9 * max(1, |N(y)|)`` with both
finite; or, with free symbols, ``expand(x - y) == 0``, or ``x - y`` is not clearly non-zero
(> 1e-6) at three fixed points and ``simplify(x - y) == 0``. Any sympy failure means "not equal".
The first line written is ``ready`` (after importing sympy and a first simplify); EOF on stdin
ends the process.
"""

from __future__ import annotations

import cmath
import functools
import json
import os
import signal
import sys

READY = b"ready\n"


@functools.lru_cache(maxsize=1)
def _namespace() -> dict:
    import sympy

    names = ("Integer", "Float", "Rational", "Symbol", "Function", "sqrt", "pi", "oo",
             "sin", "cos", "tan", "log", "exp", "E")
    namespace = {name: getattr(sympy, name) for name in names}
    namespace["__builtins__"] = {}
    return namespace


def _parse(expr: str):
    from sympy.parsing.sympy_parser import (
        convert_xor, implicit_multiplication_application, parse_expr, rationalize,
        standard_transformations,
    )

    transformations = standard_transformations + (
        implicit_multiplication_application, convert_xor, rationalize)
    return parse_expr(expr, global_dict=_namespace(), transformations=transformations)


def sympy_equal(a: str, b: str) -> bool:
    """Whether sympy shows ``a == b`` (see the module rule); may raise on odd input."""
    import sympy

    x, y = _parse(a), _parse(b)
    if x == y:
        return True
    diff = x - y
    if not diff.free_symbols:
        return _numerically_zero(diff, y)
    if sympy.expand(diff) == 0:
        return True  # polynomials and most rational expressions settle here
    if _refuted_at_random_points(diff):
        return False  # cheap: most wrong answers stop here, before any simplify
    return sympy.simplify(diff) == 0


def _numerically_zero(diff, reference) -> bool:
    import sympy

    value, scale = complex(sympy.N(diff)), complex(sympy.N(reference))
    if not (cmath.isfinite(value) and cmath.isfinite(scale)):
        return False  # oo - (-oo) is not "numerically zero"
    return abs(value) <= 1e-9 * max(1.0, abs(scale))


def _refuted_at_random_points(diff) -> bool:
    """True when ``diff`` is clearly non-zero at one of a few fixed irrational-ish points."""
    symbols = sorted(diff.free_symbols, key=str)
    for point in (0.5772156649, 1.4142135623, 2.7182818284):
        values = {s: point + 0.1 * i for i, s in enumerate(symbols)}
        value = complex(diff.evalf(subs=values))
        if cmath.isfinite(value) and abs(value) > 1e-6:
            return True
    return False


def equal_or_false(a: str, b: str) -> bool:
    try:
        return sympy_equal(a, b)
    except Exception:  # parse errors, TypeError, overflow...: "not shown equal" is the answer
        return False


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    sys.stdout = sys.stderr  # stray prints must not corrupt the protocol
    equal_or_false("sin(x)**2+cos(x)**2", "1")  # import sympy and warm simplify before "ready"
    out.write(READY)
    for line in sys.stdin.buffer:
        a, b = json.loads(line)
        out.write(b"1\n" if equal_or_false(a, b) else b"0\n")


if __name__ == "__main__":
    main()

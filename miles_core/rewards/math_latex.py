"""Translate a normalized LaTeX answer into a restricted sympy expression string.

Rule: only a small, safe grammar is translated, everything else yields None (and the answer is
then compared as a string only). Accepted: numbers, single-letter symbols (``e`` means Euler's
number), ``+ - * / ^ ( )``, brace groups, ``\\frac``, ``\\sqrt`` (with ``[n]``), ``\\pi``,
``\\infty``, ``\\cdot``, ``\\times``, ``\\div``, ``\\sin \\cos \\tan \\ln \\log \\exp``.
Adjacent letters are products (``xy`` -> ``x*y``). The output uses only digits, ``.``, operators,
parentheses, single letters and the names in :data:`ALLOWED_NAMES`, so it is safe to hand to
sympy's ``parse_expr`` (which uses ``eval``) with the restricted namespace of the sympy worker.
"""

from __future__ import annotations

import re

from miles_core.rewards._text import matching_brace

ALLOWED_NAMES = frozenset({"sqrt", "pi", "oo", "sin", "cos", "tan", "log", "exp", "E"})
MAX_EXPR_CHARS = 300

_COMMANDS = {
    "pi": "pi", "infty": "oo", "cdot": "*", "times": "*", "div": "/",
    "sin": "sin", "cos": "cos", "tan": "tan", "ln": "log", "log": "log", "exp": "exp",
}
_SAFE_RE = re.compile(r"^[0-9A-Za-z+\-*/().]*$")
_NAME_RE = re.compile(r"[A-Za-z]+")


def latex_to_expr(s: str) -> str | None:
    """The sympy-parsable form of a normalized answer, or None outside the accepted grammar."""
    if not s or len(s) > MAX_EXPR_CHARS:
        return None
    out = _convert(s)
    if out is None or not _SAFE_RE.match(out):
        return None
    if any(name not in ALLOWED_NAMES and len(name) > 1 for name in _NAME_RE.findall(out)):
        return None
    return out


def _convert(s: str) -> str | None:
    parts: list[str] = []
    i = 0
    while i < len(s):
        ch = s[i]
        if ch == "\\":
            piece, i = _command(s, i)
        elif ch == "{":
            end = matching_brace(s, i)
            inner = _convert(s[i + 1 : end]) if end > 0 else None
            piece, i = (None, i) if inner is None else ("(" + inner + ")", end + 1)
        elif ch == "^":
            piece, i = "**", i + 1
        elif ch.isalpha():
            j = i
            while j < len(s) and s[j].isalpha():
                j += 1
            piece, i = _letters(s[i:j]), j
        elif ch.isdigit() or ch in "+-*/().":
            piece, i = ch, i + 1
        else:
            return None
        if piece is None:
            return None
        parts.append(piece)
    return "".join(parts)


def _letters(run: str) -> str:
    if run in ALLOWED_NAMES - {"E"}:
        return run
    return "*".join("E" if c == "e" else c for c in run)


def _group(s: str, i: int) -> tuple[str | None, int]:
    """One argument: a brace group or a single character, converted."""
    if i >= len(s):
        return None, i
    if s[i] == "{":
        end = matching_brace(s, i)
        if end < 0:
            return None, i
        return _convert(s[i + 1 : end]), end + 1
    return _convert(s[i]), i + 1


def _command(s: str, i: int) -> tuple[str | None, int]:
    match = re.match(r"\\([A-Za-z]+)", s[i:])
    if not match:
        return None, i
    name, j = match.group(1), i + match.end()
    if name in _COMMANDS:
        return _COMMANDS[name], j
    if name == "frac":
        num, j = _group(s, j)
        den, j = _group(s, j) if num is not None else (None, j)
        return (None, j) if den is None else (f"(({num})/({den}))", j)
    if name == "sqrt":
        index = None
        if j < len(s) and s[j] == "[":
            close = s.find("]", j)
            index = _convert(s[j + 1 : close]) if close > 0 else None
            if index is None:
                return None, j
            j = close + 1
        arg, j = _group(s, j)
        if arg is None:
            return None, j
        return (f"sqrt({arg})" if index is None else f"(({arg})**(1/({index})))"), j
    return None, j

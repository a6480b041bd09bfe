"""Normalization of math answers to a canonical string, plus exact number and tuple parsing.

Rule (applied to an already extracted answer, e.g. the content of ``\\boxed{...}``):
drop LaTeX spacing (``\\!``, ``\\,``, ``\\;``, ``\\:``, ``~``), ``\\left``/``\\right``/``\\big``,
``$``, ``\\$``, degrees (``^\\circ``), percent signs (remembered: see :func:`has_percent`);
unwrap ``\\text{}``, ``\\mathrm{}``, ``\\mbox{}`` and friends; strip a trailing unit word after a
number (``5 cm^2`` -> ``5``) and a leading ``x =``; remove whitespace; ``\\dfrac``/``\\tfrac`` ->
``\\frac``, ``\\frac12`` -> ``\\frac{1}{2}``, ``\\sqrt2`` -> ``\\sqrt{2}``; thousands separators
(``1,000`` -> ``1000``); ``.5`` -> ``0.5``; a trailing full stop. Two answers whose normalized
strings are equal are equal.

:func:`to_number` reads an exact rational from a normalized answer: integers, decimals,
``a/b``, ``\\frac{a}{b}``, mixed numbers ``2\\frac{1}{2}`` (= 5/2) and ``1e3`` style numbers.
:func:`split_tuple` splits ``(a,b)``, ``[a,b)``, ``\\{a,b\\}`` and bare ``a,b`` at top-level commas.
"""

from __future__ import annotations

import re
from fractions import Fraction

from miles_core.rewards._text import matching_brace, unwrap_command

_SPACING = ("\\!", "\\,", "\\;", "\\:", "\\ ", "\\quad", "\\qquad", "~")
_SIZING_RE = re.compile(r"\\(?:left|right|[bB]ig{1,2}[lr]?)(?![A-Za-z])")
_UNWRAP = ("text", "textbf", "textit", "textrm", "textnormal", "mathrm", "mathbf",
           "mathit", "mbox", "operatorname", "boxed")
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\circ|\\degree")
_UNIT_WORDS = (
    "square units|sq units|units|unit|cm|mm|km|m|meters|meter|metres|inches|inch|in|feet|foot|ft|"
    "miles|mile|mph|yards|yd|degrees|degree|dollars|dollar|cents|cent|hours|hour|hrs|minutes|"
    "minute|mins|seconds|second|sec|days|day|weeks|years|pounds|lbs|kg|grams|gram|g|liters|"
    "litres|ml|points|ways|students|people|cups|sq"
)
_UNIT_RE = re.compile(rf"^(.*[\d}}])\s*(?:{_UNIT_WORDS})\s*(?:\^\s*\{{?[23]\}}?)?\.?$")
_LEADING_VAR_RE = re.compile(r"^\s*[A-Za-z](?:_\{?\w+\}?)?\s*=(?!=)\s*")
_THOUSANDS_RE = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_DECIMAL_RE = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d{1,3})?$")
_SLASH_RE = re.compile(r"^([+-]?\d+)/([+-]?\d+)$")
_FRAC_RE = re.compile(r"^([+-]?)\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}$")
_MIXED_RE = re.compile(r"^([+-]?)(\d+)\\frac\{(\d+)\}\{(\d+)\}$")
_PERCENT_RE = re.compile(r"\\?%|\\percent(?![A-Za-z])")
_OPEN, _CLOSE = "([{", ")]}"
MAX_NUMBER_CHARS = 1000


def has_percent(answer: str) -> bool:
    """Whether the raw answer carries a percent sign (``50\\%``)."""
    return bool(_PERCENT_RE.search(answer))


def normalize_answer(answer: str) -> str:
    """Canonical string form of a math answer (see the module rule); ``""`` for empty input."""
    s = answer.replace("\n", " ").strip()
    for token in _SPACING:
        s = s.replace(token, " " if token in ("~", "\\quad", "\\qquad") else "")
    s = _SIZING_RE.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\displaystyle", "")
    for command in _UNWRAP:
        s = unwrap_command(s, command)
    s = _DEGREE_RE.sub("", s)
    s = _PERCENT_RE.sub("", s)
    s = s.replace("\\$", "").replace("$", "").replace("{,}", ",")
    s = s.replace("\\{", "{").replace("\\}", "}")
    s = _strip_units(s.strip())
    if s.count("=") == 1:
        s = _LEADING_VAR_RE.sub("", s)
    s = re.sub(r"\s+", "", s)
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    s = _fix_shorthand(s, "\\frac", 2)
    s = _fix_shorthand(s, "\\sqrt", 1)
    s = re.sub(r"(^|[^\d])\.(\d)", r"\g<1>0.\2", s)
    return s.rstrip(".") if not s.endswith("..") else s


def _strip_units(s: str) -> str:
    match = _UNIT_RE.match(s)
    return match.group(1).strip() if match else s


def _fix_shorthand(s: str, command: str, n_args: int) -> str:
    """Brace the single-character arguments of ``command``: ``\\frac12`` -> ``\\frac{1}{2}``."""
    out: list[str] = []
    i = 0
    while True:
        j = s.find(command, i)
        if j < 0:
            out.append(s[i:])
            return "".join(out)
        k = j + len(command)
        if k < len(s) and s[k].isalpha():  # another command, e.g. \fracx is not ours
            out.append(s[i:k])
            i = k
            continue
        out.append(s[i:k])
        for _ in range(n_args):
            if k >= len(s):
                break
            if s[k] == "{":
                end = matching_brace(s, k)
                if end < 0:
                    break
                out.append(s[k : end + 1])
                k = end + 1
            elif s[k] == "[" and command == "\\sqrt":
                break
            else:
                out.append("{" + s[k] + "}")
                k += 1
        i = k


def to_number(s: str) -> Fraction | None:
    """Exact value of a normalized numeric answer, or None when it is not a plain number."""
    if len(s) > MAX_NUMBER_CHARS:
        return None
    try:
        if _DECIMAL_RE.match(s):
            return Fraction(s)
        match = _SLASH_RE.match(s)
        if match:
            return Fraction(int(match.group(1)), int(match.group(2)))
        match = _FRAC_RE.match(s)
        if match:
            value = Fraction(int(match.group(2)), int(match.group(3)))
            return -value if match.group(1) == "-" else value
        match = _MIXED_RE.match(s)
        if match:
            value = int(match.group(2)) + Fraction(int(match.group(3)), int(match.group(4)))
            return -value if match.group(1) == "-" else value
    except (ZeroDivisionError, ValueError):  # x/0; digits beyond Python's int-parsing limit
        return None
    return None


def split_tuple(s: str) -> tuple[str, list[str]] | None:
    """``(brackets, items)`` for a tuple/interval/set/list answer, None for a single value.

    ``brackets`` is the outer pair (``"()"``, ``"[)"``, ``"{}"`` ...) or ``""`` for a bare list.
    """
    brackets = ""
    body = s
    if len(s) >= 2 and s[0] in _OPEN and s[-1] in _CLOSE and _closes_at_end(s):
        brackets, body = s[0] + s[-1], s[1:-1]
    items = _top_level_split(body)
    if items is None or (len(items) < 2 and not brackets) or any(not x for x in items):
        return None
    return brackets, items


def _closes_at_end(s: str) -> bool:
    depth = 0
    for i, ch in enumerate(s):
        depth += (ch in _OPEN) - (ch in _CLOSE)
        if depth == 0:
            return i == len(s) - 1
    return False


def _top_level_split(body: str) -> list[str] | None:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        depth += (ch in _OPEN) - (ch in _CLOSE)
        if depth < 0:
            return None
        if ch == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
    if depth != 0:
        return None
    items.append(body[start:])
    return items

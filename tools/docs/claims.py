"""Claims about a config field's default, in the phrasings the pages use: one regex per phrasing, in one table.

A claim is (line, name, value text, unit): the name a field or its flag, the value as written. What the check
does with it (compare with the field's default) is in check.py; this module only finds the claims.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from .markdown import Page

_NAME = r"`(?P<name>--?[a-z][a-z0-9-]*|[a-z][a-z0-9_]*)`"
_VALUE = r"(?P<value>`[^`]+`|[^\s,;)|]+)"
_UNIT = r"(?:\s+(?P<unit>KiB|MiB|GiB))?"

# phrasing -> regex (groups: name [, name2], value [, unit])
PHRASINGS: dict[str, re.Pattern[str]] = {
    # "`x` (default y)", "`x` defaults to y", "`x` default y", "`x` and `y` default to z", "`x` (default: y)"
    "defaults to": re.compile(
        _NAME + r"(?:\s*(?:and|,)\s*`(?P<name2>[a-z][a-z0-9_-]*)`)?"
        r"\s*(?:\(|,|—|–|-)?\s*(?:the\s+)?defaults?(?:\s+(?:to|is|of))?\s*[:=]?\s*" + _VALUE + _UNIT),
    "is y by default": re.compile(_NAME + r"\s+is\s+(?:set\s+to\s+)?" + _VALUE + _UNIT + r"\s+by\s+default\b"),  # "is set to y ..."
    "by default x is y": re.compile(r"\b[Bb]y\s+default,?\s+" + _NAME + r"\s+(?:is(?:\s+set\s+to)?|=)\s+" + _VALUE + _UNIT),
    # "the default of `x` is y", "The default value for `x` is y"
    "the default of x is y": re.compile(r"\b[Tt]he\s+default(?:\s+value)?\s+(?:of|for)\s+" + _NAME + r"\s+is\s+" + _VALUE + _UNIT),
    # "`x`, the clip range (default: y)": words between the name and the parenthesis, no other code span or cell
    "(default: y)": re.compile(_NAME + r"[^`|()]*?\(default:?\s+" + _VALUE + _UNIT + r"\)"),
    # "`x` y (the default)", "`x` to y (the default)", "`x` is y (the default)"
    "y (the default)": re.compile(_NAME + r"(?:\s+(?:is|to|=)\s+|\s*[:=]\s*|\s+)" + _VALUE + _UNIT + r"\s*\(the\s+default\)"),
    # "`x: y` (the default)", "`--x y` (the default)", "`--x=y` (the default)"
    "`x: y` (the default)": re.compile(r"`(?P<name>[a-z][a-z0-9_]*):\s*(?P<value>[^`]+)`" + _UNIT + r"\s*\(the\s+default\)"),
    "`--x y` (the default)": re.compile(r"`(?P<name>--[a-z][a-z0-9-]*)[ =](?P<value>[^`]+)`" + _UNIT + r"\s*\(the\s+default\)"),
}
TABLE_NAME_COLUMNS = ("field", "flag")  # a table whose first column names fields or flags, with a "default" column
_CELL_SPAN = re.compile(r"^`(?P<name>--?[a-z][a-z0-9-]*|[a-z][a-z0-9_]*)`$")


@dataclass(frozen=True)
class DefaultClaim:
    line: int
    name: str
    value: str  # as written (a code span keeps its backticks)
    unit: str | None


def prose_claims(line: int, text: str) -> Iterable[DefaultClaim]:
    """Every default claim of one prose line, once per (name, value) even where two phrasings match."""
    seen: set[tuple[str, str]] = set()
    for pattern in PHRASINGS.values():
        for m in pattern.finditer(text):
            groups = m.groupdict()
            for name in filter(None, (groups["name"], groups.get("name2"))):
                if (name, groups["value"]) not in seen:
                    seen.add((name, groups["value"]))
                    yield DefaultClaim(line, name, groups["value"], groups.get("unit"))


def table_claims(page: Page) -> Iterable[DefaultClaim]:
    """Rows of a table headed `| field | ... | default | ...` (or `| flag | ...`): the row's field and its default cell."""
    header: list[str] | None = None
    column = -1
    rows = [(n, t.strip()) for n, t in page.prose]
    for (n, text), (_, nxt) in zip(rows, rows[1:] + [(0, "")]):
        if not text.startswith("|"):
            header = None
            continue
        cells = _cells(text)
        if header is None:
            if re.match(r"^\|?\s*:?-{3,}", nxt) and cells and cells[0].lower() in TABLE_NAME_COLUMNS and "default" in map(str.lower, cells):
                header, column = cells, [c.lower() for c in cells].index("default")
            else:
                header = []  # a table of another kind: its rows are not claims
            continue
        if header and column < len(cells) and not re.match(r"^:?-{3,}", cells[0]):
            name = _CELL_SPAN.match(cells[0])
            if name:
                yield DefaultClaim(n, name.group("name"), cells[column], None)


def _cells(row: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]

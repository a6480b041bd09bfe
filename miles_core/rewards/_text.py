"""Text helpers shared by the reward families: safe coercion and ``\\boxed{...}`` extraction.

Rule: every family grades *text*. A response that is not a string grades as ``""``; a label
that is a string is used as is, an ``int``/``float`` label (not ``bool``) becomes ``str(label)``,
anything else (``None``, lists, dicts) is "no label" and the sample scores 0.
The boxed answer is the content of the **last** ``\\boxed{...}`` or ``\\fbox{...}`` with nested
braces (escaped ``\\{``/``\\}`` do not count); an unbalanced last box means "no answer".
``\\boxed 5`` (space form, no braces) yields ``5``.
"""

from __future__ import annotations

import re
from typing import Any

_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def as_text(value: Any) -> str:
    """The response as text: strings pass through, anything else becomes ``""``."""
    return value if isinstance(value, str) else ""


def label_text(label: Any) -> str | None:
    """The label as text, or None when it cannot be graded (None, bool, list, dict, ...)."""
    if isinstance(label, str):
        return label
    if isinstance(label, (int, float)) and not isinstance(label, bool):
        return str(label)
    return None


def matching_brace(text: str, open_idx: int) -> int:
    """Index of the ``}`` closing the ``{`` at ``open_idx``, or -1 if unbalanced."""
    depth = 0
    i = open_idx
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def last_boxed(text: Any) -> str | None:
    """Content of the last ``\\boxed{...}``/``\\fbox{...}`` in ``text``; None if none or unbalanced."""
    if not isinstance(text, str):
        return None
    matches = list(_BOX_RE.finditer(text))
    if not matches:
        return None
    rest_start = matches[-1].end()
    rest = text[rest_start:]
    stripped = rest.lstrip()
    if stripped.startswith("{"):
        open_idx = rest_start + (len(rest) - len(stripped))
        close_idx = matching_brace(text, open_idx)
        return None if close_idx < 0 else text[open_idx + 1 : close_idx]
    if rest[:1].isspace() and stripped:
        # "\boxed 5$" form: the answer runs to the next space or "$".
        return re.split(r"[\s$]", stripped, maxsplit=1)[0]
    return None


def unwrap_command(text: str, command: str) -> str:
    """Replace every ``\\command{X}`` by ``X`` (brace-aware); unbalanced ones are left as they are."""
    token = "\\" + command + "{"
    out = text
    start = out.find(token)
    while start >= 0:
        open_idx = start + len(token) - 1
        close_idx = matching_brace(out, open_idx)
        if close_idx < 0:
            break
        out = out[:start] + out[open_idx + 1 : close_idx] + out[close_idx + 1 :]
        start = out.find(token, start)
    return out

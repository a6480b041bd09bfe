"""Tool-call parsers (``generate_tool_call_parser``): the text of one model turn -> the tool calls in it.

Formats, named as SGLang's function-call parsers are (the reference's ``--generate-tool-call-parser``):

- ``qwen25`` (aliases ``qwen``, ``hermes``): Qwen2.5 / Qwen3 / Hermes. Each call is a JSON object
  between tags: ``<tool_call>\\n{"name": "add", "arguments": {"a": 1}}\\n</tool_call>``;
  ``arguments`` is an object (a JSON string of an object is accepted, a missing one is ``{}``).
- ``glm45`` (alias ``glm4``): GLM-4.5 / GLM-4.6. The name on the first line, then key/value pairs:
  ``<tool_call>add\\n<arg_key>a</arg_key>\\n<arg_value>1</arg_value>\\n</tool_call>``; a value that
  parses as JSON is that JSON value, otherwise the string.

Every parser returns a ``ParsedTurn``: the calls in order, the text outside them, one message per
malformed call (bad JSON, no name, arguments not an object: not executed, counted in
``multi_turn/tool_calls/malformed``), and ``incomplete`` when an opening tag has no closing tag
(the turn hit the length limit inside a call: nothing after the tag is a call).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedTurn:
    """The tool calls of one turn's text (see the module docstring)."""

    calls: list[ToolCall] = field(default_factory=list)
    text: str = ""  # the turn's text without the call blocks
    malformed: list[str] = field(default_factory=list)
    incomplete: bool = False


def _split_blocks(text: str, parse_block: Callable[[str], ToolCall]) -> ParsedTurn:
    """Find the tagged blocks, parse each; an unclosed trailing tag marks the turn incomplete."""
    out = ParsedTurn()
    plain, end = [], 0
    for i, m in enumerate(_BLOCK.finditer(text)):
        plain.append(text[end : m.start()])
        end = m.end()
        try:
            out.calls.append(parse_block(m.group(1)))
        except ValueError as e:
            out.malformed.append(f"tool call {i}: {e}")
    rest = text[end:]
    if OPEN in rest:
        out.incomplete = True
        rest = rest[: rest.index(OPEN)]
    out.text = "".join(plain) + rest
    return out


def _arguments(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"arguments is a string that is not JSON ({e.msg})") from None
    if not isinstance(value, dict):
        raise ValueError(f"arguments must be an object, got {type(value).__name__}")
    return value


def _hermes_block(body: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at char {e.pos}): {body.strip()[:80]!r}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"no 'name' string in {body.strip()[:80]!r}")
    return ToolCall(name=name, arguments=_arguments(obj.get("arguments", obj.get("parameters"))))


def _glm_block(body: str) -> ToolCall:
    head, _, _ = body.partition("<arg_key>")
    name = head.strip()
    if not name or "\n" in name:
        raise ValueError(f"no function name before the arguments in {body.strip()[:80]!r}")
    args: dict[str, Any] = {}
    for key, raw in _GLM_ARG.findall(body):
        try:
            args[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            args[key.strip()] = raw
    leftover = _GLM_ARG.sub("", body[len(head):]).strip()
    if leftover:
        raise ValueError(f"unpaired <arg_key>/<arg_value> in {body.strip()[:80]!r}")
    return ToolCall(name=name, arguments=args)


def parse_qwen25(text: str) -> ParsedTurn:
    return _split_blocks(text, _hermes_block)


def parse_glm45(text: str) -> ParsedTurn:
    return _split_blocks(text, _glm_block)


PARSERS: dict[str, Callable[[str], ParsedTurn]] = {
    "qwen25": parse_qwen25, "qwen": parse_qwen25, "hermes": parse_qwen25,
    "glm45": parse_glm45, "glm4": parse_glm45,
}


def get_parser(name: str) -> Callable[[str], ParsedTurn]:
    if name not in PARSERS:
        raise ValueError(f"generate_tool_call_parser {name!r} is not known; valid: {sorted(PARSERS)}")
    return PARSERS[name]

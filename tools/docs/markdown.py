"""Just enough Markdown parsing for the docs check: fenced blocks (with their run marker), inline
code spans, indented command lines, links. Line numbers are 1-based."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>.*)$")
MARKER = re.compile(r"^\s*<!--\s*runnable(?::\s*(?P<kind>[a-z]+))?\s*-->\s*$")
SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*(?P<target><[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
RUN_KINDS = {None: "fast", "slow": "slow", "gpu": "gpu"}


@dataclass
class Block:
    """A fenced code block."""

    lang: str
    info: str
    line: int  # line of the first content line
    text: str
    run: str | None = None  # None (not runnable), "fast", "slow", or "gpu" (needs a GPU: parsed only)

    @property
    def is_shell(self) -> bool:
        return self.lang in SHELL_LANGS


@dataclass
class Page:
    rel: str
    text: str
    blocks: list[Block] = field(default_factory=list)
    spans: list[tuple[int, str]] = field(default_factory=list)  # (line, code span content)
    prose: list[tuple[int, str]] = field(default_factory=list)  # (line, text outside fenced blocks, spans included)
    indented: list[tuple[int, str]] = field(default_factory=list)  # (line, indented code line, stripped)
    links: list[tuple[int, str]] = field(default_factory=list)


def parse(rel: str, text: str) -> Page:
    page = Page(rel, text)
    lines = text.splitlines()
    i = 0
    prev_blank, in_indent = True, False
    marker: str | None = None
    while i < len(lines):
        line = lines[i]
        m = FENCE.match(line)
        if m:
            fence, info = m.group("fence"), m.group("info").strip()
            lang = info.split()[0].lower() if info else ""
            body, j = [], i + 1
            while j < len(lines) and not re.match(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j]):
                body.append(lines[j][len(m.group("indent")):] if lines[j].startswith(m.group("indent")) else lines[j].lstrip())
                j += 1
            page.blocks.append(Block(lang, info, i + 2, "\n".join(body), marker))
            marker, i, prev_blank, in_indent = None, j + 1, False, False
            continue
        mk = MARKER.match(line)
        if mk:
            kind = mk.group("kind")
            if kind not in RUN_KINDS:
                raise ValueError(f"{rel}:{i + 1}: unknown runnable marker kind {kind!r}; use {sorted(k for k in RUN_KINDS if k)} or none")
            marker = RUN_KINDS[kind]
            i += 1
            continue
        if line.strip():
            marker = None
        if line.startswith("    ") and line.strip() and (prev_blank or in_indent):
            in_indent = True
            page.indented.append((i + 1, line.strip()))
        else:
            if line.strip():
                in_indent = False
            page.prose.append((i + 1, line))
            page.spans += [(i + 1, s.group(2).strip()) for s in SPAN.finditer(line)]
            page.links += [(i + 1, lk.group("target").strip("<>")) for lk in LINK.finditer(SPAN.sub("", line))]
        prev_blank = not line.strip()
        i += 1
    return page

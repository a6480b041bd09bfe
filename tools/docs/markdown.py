"""Just enough Markdown parsing for the docs check: fenced blocks (with their run marker), inline
code spans, indented command lines, links, headings (their anchors). Line numbers are 1-based.

Indentation follows Python-Markdown (what mkdocs renders with): four spaces after a blank line start an
indented code block, except inside a list item or an admonition (``!!! note``), where four spaces continue
the item's text (its paragraphs, its tables) and a code block needs eight."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>.*)$")
MARKER = re.compile(r"^\s*<!--\s*runnable(?::\s*(?P<kind>[a-z]+))?\s*-->\s*$")
SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*(?P<target><[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
LINK_DEF = re.compile(r"^ {0,3}\[(?!\^)[^\]]+\]:\s*(?P<target><[^>]*>|\S+)")  # a reference link's definition: `[ref]: page.md#id`
HREF = re.compile(r"""<a\s[^>]*\bhref=["'](?P<target>[^"']+)["']""")  # a raw HTML link
CONTAINER = re.compile(r"^ {0,3}(?:[-*+]|\d+[.)])\s+\S|^ {0,3}(?:!!!|\?\?\?\+?)\s*\w")  # a list item, an admonition
HEADING = re.compile(r"^ {0,3}(?P<hashes>#{1,6})\s+(?P<title>.*?)(?:\s+#+)?\s*$")
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
    headings: list[tuple[int, str]] = field(default_factory=list)  # (line, heading text as written)
    path: Path | None = None  # the file on disk (relative links resolve from it)


def parse(rel: str, text: str, path: Path | None = None) -> Page:
    page = Page(rel, text, path=path)
    lines = text.splitlines()
    i = 0
    prev_blank, in_indent, in_container = True, False, False
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
        depth = 8 if in_container else 4
        if line.startswith(" " * depth) and line.strip() and (prev_blank or in_indent):
            in_indent = True
            page.indented.append((i + 1, line.strip()))
        else:
            if line.strip():
                in_indent = False
                if CONTAINER.match(line):
                    in_container = True
                elif prev_blank and not line.startswith("    "):
                    in_container = False  # a paragraph at the margin after a blank line ends the list
            _prose(page, i + 1, line)
        prev_blank = not line.strip()
        i += 1
    return page


def _prose(page: Page, number: int, line: str) -> None:
    page.prose.append((number, line))
    page.spans += [(number, s.group(2).strip()) for s in SPAN.finditer(line)]
    bare = SPAN.sub("", line)
    page.links += [(number, lk.group("target").strip("<>")) for lk in LINK.finditer(bare)]
    page.links += [(number, lk.group("target").strip("<>")) for lk in (*filter(None, [LINK_DEF.match(bare)]), *HREF.finditer(bare))]
    h = HEADING.match(line)
    if h:
        page.headings.append((number, h.group("title")))

"""Relative links of a page: the target file exists and the anchor is an id of the target page as mkdocs renders it.

The ids come from Python-Markdown itself, run with the extensions mkdocs.yml lists (toc's slugs, attr_list's
``{#id}``, raw HTML ids), so a heading renamed on one page fails the check on every page linking to it, in
the docs check (``make test``), not only in ``mkdocs build --strict``. The slug rule is therefore mkdocs' own,
not a copy: Python-Markdown 3.11.3's ``markdown/extensions/toc.py::slugify`` (line 39) and ``unique`` (line 57,
the ``_1`` suffix of a repeated heading), called from ``TocTreeprocessor.run`` (line 404).

Links are inline ``[text](target)``, reference definitions ``[ref]: target`` and raw ``<a href="target">``
(markdown.py collects all three).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from . import ROOT

SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:")  # http:, mailto:, ...
_ID = re.compile(r"""\bid=["']([^"']+)["']""")


def link_problem(page: Path, target: str) -> str | None:
    """Why the link ``target`` written on the page at ``page`` goes nowhere, or None."""
    if SCHEME.match(target) or target.startswith("/"):
        return None  # absolute URLs are not ours (mkdocs warns on absolute paths: validation.absolute_links)
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page.resolve()
    if not dest.exists():
        return f"link target {path} does not exist (from {page.name})"
    if anchor and dest.is_file() and dest.suffix == ".md":
        ids = page_ids(dest, dest.stat().st_mtime_ns)
        if anchor not in ids:
            near = [i for i in ids if i.startswith(anchor[:4])][:3] or sorted(ids)[:3]
            return f"link {target}: {dest.name} has no heading or id {anchor!r} (its ids include {', '.join(near)})"
    return None


@lru_cache(maxsize=None)
def page_ids(path: Path, _mtime: int) -> frozenset[str]:
    """The ids of a Markdown page rendered as mkdocs renders it (cached per file version)."""
    html = _markdown().convert(path.read_text(encoding="utf-8"))
    _markdown().reset()
    return frozenset(_ID.findall(html))


@lru_cache(maxsize=1)
def _markdown():
    import markdown
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    names, options = [], {}
    for ext in config.get("markdown_extensions", []):
        name, opts = next(iter(ext.items())) if isinstance(ext, dict) else (ext, {})
        names.append(name)
        options[name] = opts or {}
    return markdown.Markdown(extensions=names, extension_configs=options)

"""The generated reference pages: fresh, complete (every config field and CLI flag), and generated only."""

from __future__ import annotations

import ast
import re

from tools.docs import DOCS, ROOT, facts
from tools.docs.generate import ENV_NOTES, _cell, _code, render_all, stale


def test_generated_pages_are_fresh():
    assert stale() == [], "generated docs are stale: run `make docs` (or python -m tools.docs generate)"


def test_every_config_field_is_in_the_config_reference():
    page = render_all()["reference/config.md"]
    rows = set(re.findall(r"^\| `([a-z0-9_]+)` \| `(--[a-z0-9-]+)`", page, re.M))
    fields = facts.config_fields()
    assert rows == {(f.name, f.flag) for f in fields.values()}
    for f in fields.values():  # type, default and description of each field are in its row
        row = next(line for line in page.splitlines() if line.startswith(f"| `{f.name}` |"))
        assert _code(f.default_text) in row and _cell(f.description)[:40] in row, row


def test_every_cli_flag_is_in_the_cli_reference():
    page = render_all()["reference/cli.md"]
    commands = facts.cli_commands()
    assert {"train", "config", "recipes", "export"} <= set(commands)
    for name, cmd in commands.items():
        assert f"## miles {name}\n" in page
        for flag in cmd.flags - {"--help"}:
            assert f"`{flag}`" in page, f"miles {name} {flag} missing from docs/reference/cli.md"
    train_flags = commands["train"].flags
    assert {f.flag for f in facts.config_fields().values()} <= train_flags  # every field is a flag


def test_every_catalog_entry_is_in_the_metrics_reference():
    from miles_core.tracking.catalog import CATALOG

    page = render_all()["reference/metrics.md"]
    assert all(f"`{m.name}`" in page for m in CATALOG)


def test_env_notes_cover_exactly_the_env_vars_of_the_code():
    code = set(facts.env_vars())
    assert {"MILES_CACHE_DIR", "MILES_ALLOW_HUB", "MILES_METRICS_CHECK", "HF_HUB_OFFLINE"} <= code
    assert set(ENV_NOTES) == code, f"missing notes: {sorted(code - set(ENV_NOTES))}, notes for gone vars: {sorted(set(ENV_NOTES) - code)}"


def test_every_shipped_recipe_is_documented():
    page = (DOCS / "models.md").read_text()
    for recipe in facts.recipes():
        assert f"| `{recipe}` |" in page, f"recipe {recipe} missing from the table in docs/models.md"


def test_every_page_is_in_the_nav():
    import yaml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    def files(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for v in node.values():
                yield from files(v)
        elif isinstance(node, list):
            for v in node:
                yield from files(v)

    listed = set(files(nav))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages - listed == set(), "pages missing from nav in mkdocs.yml"
    assert listed - pages == set(), "nav entries without a page"


def test_the_library_never_imports_the_docs_tools():
    for path in facts.py_files(facts.CODE_PACKAGES):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            assert not any(n == "tools" or n.startswith("tools.") for n in names), f"{path} imports {names}"

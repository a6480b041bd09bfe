"""The docs site builds offline with mkdocs --strict (warnings are errors), and a broken link fails it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import yaml

from tools.docs import DOCS, ROOT


def build(config: str, site: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", config, "--site-dir", site],
                          cwd=ROOT, env=env, text=True, capture_output=True, timeout=300)


def test_the_site_builds_strict(tmp_path):
    r = build(str(ROOT / "mkdocs.yml"), str(tmp_path / "site"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "metrics.html").is_file()
    assert (tmp_path / "site" / "search" / "search_index.json").is_file()  # search works offline


def test_a_broken_link_fails_the_build(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    page = docs / "guide" / "concepts.md"
    page.write_text(page.read_text() + "\nSee [the old page](../guide/loop.md).\n")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["docs_dir"] = str(docs)
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    r = build(str(tmp_path / "mkdocs.yml"), str(tmp_path / "site"))
    assert r.returncode != 0 and "loop.md" in r.stdout + r.stderr

"""python -m tools.docs generate | check | build | all

generate   write docs/reference/{config,cli,metrics,env}.md from the code (--check: only report stale pages)
check      the docs check (flags, keys, defaults, env vars, paths, modules, metrics, commands, stale pages);
           --run fast,slow also runs the blocks marked runnable (fast: by default)
build      mkdocs build --strict into --site-dir (default: a temp dir)
all        generate, check (running the fast blocks), build: what `make docs` does
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from . import ROOT


def build(site_dir: str | None = None) -> int:
    """mkdocs build --strict (warnings are errors), offline. -> exit code."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
               "--site-dir", site_dir or tmp]
        return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.docs", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="write the generated reference pages")
    g.add_argument("--check", action="store_true", help="only report stale pages (exit 1 if any)")
    c = sub.add_parser("check", help="check every page against the code")
    c.add_argument("--run", default="fast", help="runnable blocks to run: fast, slow, fast,slow or none")
    b = sub.add_parser("build", help="mkdocs build --strict")
    b.add_argument("--site-dir", default=None)
    sub.add_parser("all", help="generate, check, build")
    args = p.parse_args(argv)

    from .check import check
    from .generate import stale, write

    if args.cmd == "generate":
        if args.check:
            bad = stale()
            print("\n".join(f"stale: docs/{rel}" for rel in bad) or "generated pages are up to date")
            return 1 if bad else 0
        changed = write()
        print("\n".join(f"wrote docs/{rel}" for rel in changed) or "generated pages are up to date")
        return 0
    if args.cmd == "build":
        return build(args.site_dir)
    if args.cmd == "all":
        for rel in write():
            print(f"wrote docs/{rel}")
    run = ("fast",) if args.cmd == "all" else () if args.run == "none" else tuple(args.run.split(","))
    problems = check(run=run)
    for prob in problems:
        print(prob)
    print(f"{len(problems)} problems")
    if problems:
        return 1
    return build() if args.cmd == "all" else 0


if __name__ == "__main__":
    sys.exit(main())

"""The docs check: every flag, config key, default, env var, path, module path, metric name and command
that a page names must exist in (or agree with) the code. Runnable shell blocks are run.

What is checked where (a "code span" is `inline code`; "code" is a span or a code block):

| kind | rule |
|---|---|
| flag | every `--flag` anywhere is a flag of `miles`, of a `python -m` entry point of this repository, an EXTERNAL_FLAGS entry, an SGLang passthrough `--sglang-<flag>` of the pinned snapshot, or a reference flag `miles recipe import` reads; on a `miles <cmd>` command line it must be a flag of that command (after `miles recipe import ... --`: one the importer reads) |
| value | a config flag's value on a command line (any shell block, runnable or not; an indented line) or in a code span (`--flag value`, `--flag=value`) is a valid value of its field: a `Literal` choice, the type, the range |
| command | `prefect deployment run [options] <flow>/<name>` (parsed by Prefect's own CLI) names a deployment of deployments/prefect.yaml; `miles <cmd>` names a command and, for train/config, a recipe that exists; `python -m <module>` of this repository exists; `make <target>` exists |
| config | keys of a ```yaml block are config fields with valid values (or the block validates against the pydantic model named by a `# schema: pkg.mod.Model` first line); `` `key: value` `` of a config field has a valid value |
| default | a default claim in any phrasing of claims.PHRASINGS ("`field` (default X)", "`field` is X by default", "by default `field` is X", "the default of `field` is X", "(default: X)", "X (the default)", ...) or in the default column of a `| field | ... | default |` table agrees with the field's default |
| planned | "`field` (planned)" of a config field: no code reads the field yet |
| name | a snake_case code span (`compute_advantages`, `group_index`) is a name the code defines or uses |
| env | an UPPER_CASE code span with `_` is an env var miles sets or reads (or a Python constant); `VAR=x cmd`, `export VAR=x`, `env VAR=x cmd` and a code span `NAME=value` set a known variable to a value the code that reads it takes (envvalues.py: the reader's own parser) |
| path | a repository path in code (`miles_core/x.py`, `deployments/recipes/tiny.yaml`, `path.py::Symbol`) exists (and defines Symbol) |
| module | a dotted module path in code (`miles_core.x.y[.Symbol]`, `from miles_core.x import y`) exists |
| metric | a metric name in code (a code word starting with a catalog prefix: `rollout/`, `train/`, `multi_turn/`, ...), in prose, in a table cell (a code span or the bare name), in a list item, is in the catalog; `<x>` parts and `*` match any text |
| stale | a generated page equals a fresh render |
| link | a relative link (a page, README.md) points at a file that exists and, with `#anchor`, at an id of that page as mkdocs renders it (links.py) |
| run | a block marked `<!-- runnable -->` (or `<!-- runnable: slow -->`) exits 0; `<!-- runnable: gpu -->` blocks only parse (bash -n) |
"""

from __future__ import annotations

import ast
import difflib
import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from . import DOCS, ROOT, envvalues, facts, links
from .generate import PAGES, render_all, stale
from .claims import DefaultClaim, prose_claims, table_claims
from .markdown import Block, Page, parse

# runnable blocks run at once by check() (two: the CPUs of the machine `make test` is sized for)
RUN_CONCURRENCY = 2

# `python -m <module> <subcommand>` handled by another module's parser (its flags are checked there)
DELEGATED = {("bench", "bg"): "bench.background"}

# Flags of tools that are not ours, which pages may name (mlflow, pip, pytest, mkdocs, sglang, ...).
EXTERNAL_FLAGS = {
    "--backend-store-uri", "--port", "--host",  # mlflow ui / server
    "--strict", "--config-file", "--site-dir",  # mkdocs build
    "--no-deps", "--editable", "--upgrade", "--quiet", "--disable-pip-version-check", "--requirement",  # pip
    "--ignore-requires-python", "--no-build-isolation",  # pip
    "--maxfail", "--durations", "--timeout", "--collect-only", "--import-mode", "--deselect",  # pytest
    "--model-path", "--enable-deterministic-inference", "--tp", "--mem-fraction-static",  # sglang.launch_server
    "--pool", "--cron", "--name", "--params", "--param", "--type", "--work-queue", "--prefect-file",  # prefect CLI
    "--address", "--head", "--num-cpus", "--num-gpus",  # ray start
    "--logdir",  # tensorboard
}
# Names from libraries or protocols that pages may put in code spans without the code using them.
EXTERNAL_NAMES = {
    "input_token_logprobs", "sampling_seed", "output_token_logprobs", "serialized_named_tensors", "launch_server",
    "prefect_test_harness", "num_labels", "pass_at_k", "log_ratio",
}
EXTERNAL_ENV = {"CUDA_VISIBLE_DEVICES", "NO_MKDOCS_2_WARNING", "CI", "PATH", "HOME", "PYTHONPATH", "OMP_NUM_THREADS", "WANDB_MODE",
                "WANDB_API_KEY", "WANDB_BASE_URL"}  # W&B's own: its key and server
REPO_DIRS = ("miles_core", "flows", "tasks", "deployments", "docs", "tests", "bench", "docker", "tools", ".ci")
REPO_FILES = ("README.md", "Makefile", "pyproject.toml", "requirements.lock", "mkdocs.yml")
FILE_EXT = re.compile(r"\.(py|ya?ml|md|json|toml|lock|txt|cfg|sh)$")
BARE_FILE = re.compile(r"\.(py|md)$")  # a bare `name.py` is a repository file; `meta.json` is a file miles writes
HISTORY_PAGES = {"docs/decisions.md"}  # dated history: names there may be gone from the code on purpose
# At the end of a line: it names something deliberately absent (a reference name we do not use, an example of a user's own name).
OPT_OUT = ("<!-- not-in-code -->", "# not-in-code")
MODULE = re.compile(r"^(?:miles_core|flows|tasks|tools|bench)(?:\.[A-Za-z_]\w*)+$")
SNAKE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")
ENV_TOKEN = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")
FLAG = re.compile(r"(?<![\w/.\-])(--[a-z][a-z0-9]*(?:-[a-z0-9]+)*)")
UNITS = {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
PLANNED_CLAIM = re.compile(r"`(?P<name>--?[a-z][a-z0-9-]*|[a-z][a-z0-9_]*)`\s*\(planned\)")
ENV_ASSIGN = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*)=(?P<value>\S*)(?:\s+(?P<cmd>.*))?$")
PLACEHOLDER_VALUE = re.compile(r"[<>$]|\.\.\.|^\{|^[A-Z_]+$")  # `--lr <x>`, `--lr $LR`, `--lr ...`, `--lr LR`
ENV_PLACEHOLDER = re.compile(r"[<>$]|\.\.\.|^\{")  # `KEY=$KEY`, `NAME=<value>`: uppercase values (WARNING) are real ones
BARE_METRIC = re.compile(r"^[a-z][a-z0-9_]*/[A-Za-z0-9_@<>*./\-]+$")  # a table cell that is only a metric name
KEY_VALUE = re.compile(r"^(?P<key>[a-z][a-z0-9_]*):\s+(?P<value>\S.*)$")


@dataclass(frozen=True)
class Problem:
    page: str
    line: int
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: [{self.kind}] {self.message}"


# ---- the code side (cached) ------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _all_argparse_flags() -> frozenset[str]:
    out: set[str] = set()
    for path in facts.py_files(("miles_core", "flows", "tasks", "bench", "tools", "docker")):
        for node in ast.walk(facts._parse(path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                out |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
    return frozenset(out)


class Code:
    """What the code offers, computed once per check."""

    def __init__(self) -> None:
        self.fields = facts.config_fields()
        self.commands = facts.cli_commands()
        self.miles_flags = set().union(*(c.flags for c in self.commands.values())) | facts.cli_root_flags()
        from miles_core.config.server_args import cli_flags, snapshot

        snap = snapshot()  # the pinned SGLang's server arguments (miles_core/config/server_args.json)
        self.sglang_flags = cli_flags() | {"--sglang"}  # passthroughs of miles train / config / eval; the prefix of --sglang-<flag>
        self.sglang_keys = {f"sglang_{name}" for name in snap.spellings}  # recipe keys: checked by the loader, like fields
        native = {f for a in snap.args.values() for f in a.flags} | {"--no-" + a.flag[2:] for a in snap.args.values()
                                                                     if a.kind == "boolean_optional"}
        from miles_core.reference_import import known_flags

        self.reference_flags = set(known_flags())  # what `miles recipe import` reads after `--` (the reference's vocabulary)
        self.all_flags = self.miles_flags | _all_argparse_flags() | EXTERNAL_FLAGS | self.sglang_flags | native | self.reference_flags
        self.env = set(facts.env_vars())
        self.build_args = facts.docker_build_args()  # NAME=value in docs/docker.md: docker build --build-arg
        self.names = facts.identifiers() | EXTERNAL_NAMES | self.sglang_keys
        self.recipes = set(facts.recipes())
        self.deployments = facts.deployment_names()
        self.unused = facts.unused_config_fields()
        self.make_targets = set(re.findall(r"^([a-zA-Z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
        self.metric_prefixes = metric_prefixes()
        self.flag_field = {f.flag: f for f in self.fields.values()} | {"--no-" + f.flag[2:]: f for f in self.fields.values() if f.is_bool}


# ---- helpers ---------------------------------------------------------------------------------------
def parse_value(text: str) -> Any:
    """A value as written in docs: JSON / YAML-ish literals, None; else the text itself."""
    t = text.strip().strip("`").rstrip(".")
    if t in ("None", "none", "null", "~"):
        return None
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    try:
        return json.loads(t)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        return t.strip("'\"")


def same_value(claim: Any, actual: Any) -> bool:
    if isinstance(actual, bool) or isinstance(claim, bool):
        return claim is actual
    if isinstance(actual, (int, float)) and isinstance(claim, (int, float)):
        return abs(float(claim) - float(actual)) <= 1e-12 * max(1.0, abs(float(actual)))
    return claim == actual


def _is_literal(text: str) -> bool:
    v = parse_value(text)
    return v is None or isinstance(v, (bool, int, float)) or text.strip().startswith(("`\"", "\"", "`'"))


def metric_prefixes() -> tuple[str, ...]:
    """The first parts of the catalog's names (``rollout/``, ``multi_turn/``, ...): a code word starting with one is a metric."""
    from miles_core.tracking import catalog

    return tuple(sorted({m.name.split("/")[0] + "/" for m in catalog.entries() if "/" in m.name}))


def metric_known(name: str) -> bool:
    """A literal key or a docs pattern (`<x>` parts, `*`) that matches the catalog."""
    from miles_core.tracking import catalog

    name = name.rstrip(".,;:")
    name = re.sub(r"@k\b", "@<k>", name)
    if "<" not in name and "*" not in name:
        if catalog.match(name) is not None:
            return True
        return catalog.match(re.sub(r"pass_(\d+)$", r"pass@\1", name)) is not None  # the sanitized spelling
    pattern = re.compile("".join(".+" if p.startswith("<") else ".*" if p == "*" else re.escape(p)
                                 for p in re.split(r"(<[^<>]*>|\*)", name) if p) + r"\Z")
    return any(pattern.match(m.name) for m in catalog.entries())


@lru_cache(maxsize=None)
def prefect_run_name(args: tuple[str, ...]) -> tuple[str | None, str | None]:
    """The deployment name of `prefect deployment run <args>` as Prefect's own CLI parses them (cyclopts: options such as
    `--param k=v` may come before the name), or None where `--id` names it; -> (name, None) or (None, why it is refused)."""
    from prefect.cli.deployment import deployment_app

    try:
        _, bound, _ = deployment_app.parse_args(["run", *args], exit_on_error=False, print_error=False)
    except Exception as e:  # cyclopts' CycloptsError: an unknown option, a missing value
        return None, str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return bound.arguments.get("name"), None


def repo_path_problem(token: str) -> str | None:
    """None if a repository path (optionally path::Symbol, or a glob) exists; else why not."""
    path, _, symbol = token.partition("::")
    path = path.rstrip("/")
    if any(ch in path for ch in "*?["):
        return None if list(ROOT.glob(path)) or _suffix_matches(path, glob=True) else f"no file matches {path}"
    full = ROOT / path
    if not full.exists():
        if "/" not in path or path.split("/")[0] not in REPO_DIRS:
            matches = _suffix_matches(path)
            if not matches:
                return f"no file {path} in the repository"
            full = matches[0]
        else:
            return f"no file {path} in the repository"
    if symbol and full.suffix == ".py" and not facts.symbol_in_file(full, symbol.rstrip("()")):
        return f"{path} defines no {symbol}"
    return None


def _suffix_matches(path: str, glob: bool = False) -> list[Path]:
    out = []
    for d in REPO_DIRS:
        for p in (ROOT / d).rglob("*"):
            rel = p.relative_to(ROOT).as_posix()
            if "__pycache__" in rel:
                continue
            if (fnmatch.fnmatch(rel, f"*/{path}") or fnmatch.fnmatch(rel, path)) if glob else (rel.endswith("/" + path) or rel == path):
                out.append(p)
    return out


def _is_rm_type(name: str) -> bool:
    from miles_core.rewards import validate_rm_type

    try:
        validate_rm_type(name)
        return True
    except ValueError:
        return False


def _looks_like_repo_path(token: str) -> bool:
    if "<" in token or token.startswith(("/", "http", "~", "sqlite:", "file:", "builtin:", "ray:", "s3:")) or " " in token:
        return False
    head = token.split("/")[0]
    base = token.partition("::")[0]
    return head in REPO_DIRS or base in REPO_FILES or ("/" not in base and bool(BARE_FILE.search(base)) and base.count(".") == 1
                                                       and not base.startswith("."))


# ---- the checks on one page ------------------------------------------------------------------------
class PageCheck:
    def __init__(self, page: Page, code: Code, run: set[str], started: dict[int, Future] | None = None):
        """``started``: the page's runnable blocks already started (execute_block), by line; the rest run here."""
        self.page, self.code, self.run = page, code, run
        self.started = started or {}
        self.problems: list[Problem] = []

    def add(self, line: int, kind: str, message: str) -> None:
        lines = self.page.text.splitlines()
        if kind != "run" and (self.page.rel in HISTORY_PAGES or (0 < line <= len(lines) and lines[line - 1].rstrip().endswith(OPT_OUT))):
            return
        self.problems.append(Problem(self.page.rel, line, kind, message))

    def check(self) -> list[Problem]:
        p = self.page
        for line, text in p.prose:
            self.flags(line, text)
            self.claims(line, text)
            self.table_cells(line, text)
        for line, text in p.indented:
            self.flags(line, text)
            if re.match(r"^(\$ )?(\S*/)?(miles|python3?|make|prefect)\s", text):
                self.command_line(line, text)
        for line, span in p.spans:
            self.span(line, span)
        for block in p.blocks:
            self.block(block)
        for line, target in p.links:
            self.link(line, target)
        for claim in table_claims(p):
            self.default_claim(claim)
        return self.problems

    # flags anywhere
    def flags(self, line: int, text: str) -> None:
        text = re.sub(r"https?://\S+", "", text)
        for flag in FLAG.findall(text):
            if flag not in self.code.all_flags:
                self.add(line, "flag", f"{flag} is not a flag of miles, of a `python -m` entry point here, or of a known tool")

    # a table cell that is a bare metric name (`| perf/step_time | ... |`, no backticks): in the catalog, as in a code span
    def table_cells(self, line: int, text: str) -> None:
        if not text.strip().startswith("|"):
            return
        for cell in re.split(r"(?<!\\)\|", text.strip().strip("|")):
            cell = cell.strip()
            if BARE_METRIC.match(cell) and cell.startswith(self.code.metric_prefixes):
                self.token(line, cell, names=False)

    # "`x` (default y)", "`x` is y by default", ... (claims.PHRASINGS), "`x` (planned)"
    def claims(self, line: int, text: str) -> None:
        for claim in prose_claims(line, text):
            self.default_claim(claim)
        for m in PLANNED_CLAIM.finditer(text):
            name = m.group("name")
            field = self.code.flag_field.get(name) or self.code.fields.get(name)
            if field is not None and field.name not in self.code.unused:  # (a planned value or feature is not checked)
                self.add(line, "planned", f"{field.name} is marked planned, but the code reads it now: update the page")

    def default_claim(self, claim: DefaultClaim) -> None:
        field = self.code.flag_field.get(claim.name) or self.code.fields.get(claim.name)
        value = claim.value
        if field is None or field.required:
            return
        if field.is_bool and value.strip("`").lower() in ("on", "off"):
            value = "true" if value.strip("`").lower() == "on" else "false"
        if field.choices and value.strip("`").strip("'\"") in field.choices:
            value = json.dumps(value.strip("`").strip("'\""))  # a Literal choice written bare: `ray`
        if not _is_literal(value):
            return
        got = parse_value(value)
        if claim.unit and isinstance(got, (int, float)):
            got = got * UNITS[claim.unit]
        if not same_value(got, field.default):
            unit = f" {claim.unit}" if claim.unit else ""
            self.add(claim.line, "default", f"{claim.name}: the page says default {claim.value.strip('`').rstrip('.')}{unit}, the code's "
                                            f"default is {field.default_text}")

    # one inline code span
    def span(self, line: int, span: str) -> None:
        token = span.strip().rstrip(".,;:")
        if re.match(r"^(\$ )?(\S*/)?(miles|python3?|make|prefect)\s", token) or re.match(r"^(export|env)\s+[A-Z]\w*=", token):
            self.command_line(line, token)
            return
        env = ENV_ASSIGN.match(token)
        if env:  # `NAME=1` or `NAME=1 miles ...`
            self.command_line(line, token) if env.group("cmd") else self.env_assignment(line, env.group("name"), env.group("value"))
            return
        if token.startswith("--"):  # `--flag value`, `--flag=value`
            self.flag_values(line, shlex.split(token) if token.count('"') % 2 == 0 else token.split())
        kv = KEY_VALUE.match(token)
        if kv and " " not in kv.group("key"):
            self.key_value(line, kv.group("key"), kv.group("value"))
            return
        if " " in token:
            self.code_words(line, token)
            return
        self.token(line, token, names=True)

    def token(self, line: int, token: str, names: bool) -> None:
        bare = re.sub(r"\(.*\)$", "", token)  # compute_advantages() -> compute_advantages
        if bare in self.code.metric_prefixes:  # a prefix, not a name
            return
        if bare.startswith(self.code.metric_prefixes) and not FILE_EXT.search(bare) and "/" in bare:
            if not metric_known(bare):
                self.add(line, "metric", f"{bare} is not in the metrics catalog (miles_core/tracking/catalog.py)")
            return
        if MODULE.match(bare):
            why = facts.resolve_module_path(bare)
            if why:
                self.add(line, "module", f"{bare}: {why}")
            return
        if _looks_like_repo_path(bare):
            why = repo_path_problem(bare)
            if why:
                self.add(line, "path", why)
            return
        if ENV_TOKEN.match(bare):
            if bare not in self.code.env and bare not in EXTERNAL_ENV and bare not in self.code.names:
                self.add(line, "env", f"{bare} is not an env var miles sets or reads (miles_core/env.py, flows/env.py), nor a name in the code")
            return
        if names and SNAKE.match(bare) and bare not in self.code.names and not _is_rm_type(bare):
            near = [f for f in self.code.fields if f.startswith(bare[:6])][:3]
            hint = f" (config fields: {', '.join(near)})" if near else ""
            self.add(line, "name", f"{bare} is not a config field or a name in the code{hint}")
        if names and "." in bare and not bare.startswith(".") and re.match(r"^[A-Za-z_][\w.]*$", bare) and bare.split(".")[0] in self.code.names:
            for part in bare.split("."):
                if SNAKE.match(part) and part not in self.code.names:
                    self.add(line, "name", f"{bare}: {part} is not a name in the code")

    def code_words(self, line: int, text: str) -> None:
        """Tokens of code text (a multi-word span or a code block line): metrics, modules, paths."""
        for tok in re.findall(r"[A-Za-z0-9_@<>*./:\-]+", text):
            tok = tok.strip(".:,")
            if tok.startswith(self.code.metric_prefixes) or MODULE.match(tok) or (_looks_like_repo_path(tok) and "/" in tok):
                self.token(line, tok, names=False)

    def key_value(self, line: int, key: str, value: str) -> None:
        field = self.code.fields.get(key)
        if field is None:
            if key not in self.code.names:
                self.add(line, "config", f"{key}: not a config field (nor a name in the code)")
            return
        v = parse_value(value)
        if field.choices and "<" not in value and str(v) not in field.choices:
            self.add(line, "config", f"{key}: {value} is not one of {', '.join(field.choices)}")
        elif field.is_bool and not isinstance(v, bool):
            self.add(line, "config", f"{key}: {value} is not true/false")

    # fenced blocks
    def block(self, b: Block) -> None:
        if b.is_shell:
            for offset, cmd in _shell_lines(b.text):
                self.flags(b.line + offset, cmd)
                self.command_line(b.line + offset, cmd)
            if b.run == "gpu":
                r = subprocess.run(["bash", "-n"], input=b.text, text=True, capture_output=True)
                if r.returncode:
                    self.add(b.line, "run", f"shell block does not parse: {r.stderr.strip()}")
            elif _runs_here(b, self.run):  # the same rule check() starts the blocks by
                self.run_block(b)
        elif b.run:
            self.add(b.line, "run", f"a runnable marker on a {b.lang or 'plain'} block; only shell blocks run")
        if b.lang in ("yaml", "yml"):
            self.yaml_block(b)
        elif b.lang == "python":
            self.python_block(b)
        if not b.is_shell:
            for i, text in enumerate(b.text.splitlines()):
                self.code_words(b.line + i, text)
                if text.startswith("$ "):  # a transcript: the command after the prompt
                    self.flags(b.line + i, text[2:])
                    self.command_line(b.line + i, text[2:])

    def yaml_block(self, b: Block) -> None:
        import yaml

        try:
            data = yaml.safe_load(b.text)
        except yaml.YAMLError as e:
            self.add(b.line, "config", f"yaml block does not parse: {e}")
            return
        first = b.text.lstrip().splitlines()[0] if b.text.strip() else ""
        schema = re.match(r"#\s*schema:\s*(\S+)", first)
        if not isinstance(data, dict):
            return
        if schema:
            self.schema_block(b.line, schema.group(1), data)
            return
        from miles_core.config import GROUPS

        allowed = set(self.code.fields) | set(GROUPS) | self.code.sglang_keys
        data = {**{k: v for k, v in data.items() if k not in GROUPS or not isinstance(v, dict)},
                **{k: v for g in GROUPS if isinstance(data.get(g), dict) for k, v in data[g].items()}}
        for key in data:
            if key not in allowed:
                line = b.line + next((n for n, t in enumerate(b.text.splitlines()) if t.strip().startswith(f"{key}:")), 0)
                self.add(line, "config", f"{key}: not a config field")
            elif key in self.code.fields:
                self.key_value(b.line, key, json.dumps(data[key]) if not isinstance(data[key], str) else data[key])
            elif key in self.code.sglang_keys:
                self.passthrough_value(b.line, key, data[key])

    def passthrough_value(self, line: int, key: str, value: Any) -> None:
        """An SGLang passthrough in a YAML block: its value as the loader checks it (type, closed choices)."""
        from miles_core.config.server_args import OWNED, PassthroughError, check_value, resolve, snapshot

        if snapshot().spellings[key.removeprefix("sglang_")] in OWNED:
            self.add(line, "config", f"{key}: miles sets this SGLang argument itself; a recipe cannot pass it")
            return
        try:
            check_value(resolve(key.removeprefix("sglang_")), value)
        except PassthroughError as e:
            self.add(line, "config", str(e))

    def schema_block(self, line: int, dotted: str, data: dict) -> None:
        """Validate a YAML block with the pydantic model its `# schema:` line names."""
        why = facts.resolve_module_path(dotted)
        if why:
            self.add(line, "module", f"schema {dotted}: {why}")
            return
        import importlib

        from pydantic import ValidationError

        mod, _, attr = dotted.rpartition(".")
        try:
            getattr(importlib.import_module(mod), attr).model_validate(data)
        except ValidationError as e:
            errs = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
            self.add(line, "config", f"yaml block is not a valid {attr}: {errs}")

    def python_block(self, b: Block) -> None:
        try:
            tree = ast.parse(b.text)
        except SyntaxError:
            return  # a sketch with "..." is fine; its tokens are still checked as code words
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and MODULE.match(node.module + ".x"):
                for alias in node.names:
                    dotted = f"{node.module}.{alias.name}"
                    why = facts.resolve_module_path(dotted) if facts.module_file(dotted) is None else None
                    if why:
                        self.add(b.line + node.lineno - 1, "module", f"{dotted}: {why}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if MODULE.match(alias.name + ".x") and facts.module_file(alias.name) is None:
                        self.add(b.line + node.lineno - 1, "module", f"{alias.name}: no such module in this repository")

    # commands
    def command_line(self, line: int, text: str) -> None:
        try:
            words = shlex.split(text, comments=True)
        except ValueError:
            return
        for argv in _split_commands(words):
            if argv and argv[0] == "!":  # an expected failure
                argv = argv[1:]
            if argv and argv[0] in ("export", "env"):  # `export NAME=value`, `env NAME=value cmd`: the same assignments
                argv = argv[1:]
            while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
                self.env_assignment(line, *argv.pop(0).split("=", 1))
            if argv:
                self.argv(line, argv)

    def argv(self, line: int, argv: list[str]) -> None:
        prog = argv[0].rsplit("/", 1)[-1]
        if prog == "miles":
            self.miles_argv(line, argv[1:])
        elif prog.startswith("python") and len(argv) > 2 and argv[1] == "-m":
            module = argv[2]
            if module.split(".")[0] in ("miles_core", "flows", "tasks", "tools", "bench"):
                flags = facts.argparse_flags(module)
                if flags is None:
                    self.add(line, "command", f"python -m {module}: no such module in this repository")
                    return
                if module.startswith("tools.docs"):
                    return
                rest = argv[3:]
                sub = DELEGATED.get((module, rest[0] if rest else None))
                if sub is not None:  # `python -m bench bg ... -- <bench command>`: the part before -- is the sub-module's
                    cut = rest.index("--") if "--" in rest else len(rest)
                    rest, inner = rest[:cut], rest[cut + 1 :]
                    module, flags = sub, facts.argparse_flags(sub) or set()
                    if inner:
                        self.argv(line, [argv[0], "-m", argv[2], *inner])
                for a in rest:
                    f = a.split("=")[0]
                    if f.startswith("--") and f not in flags:
                        self.add(line, "flag", f"{f} is not a flag of python -m {module}")
        elif prog == "prefect" and argv[1:3] == ["deployment", "run"] and len(argv) > 3:
            name, why = prefect_run_name(tuple(argv[3:]))
            if why and any(ENV_PLACEHOLDER.search(a) for a in argv[3:]):  # `--param target=<flow-run name>`: a sketch, split by shlex
                name, why = (argv[3] if not argv[3].startswith("-") else None), None
            if why:
                self.add(line, "command", f"prefect deployment run {' '.join(argv[3:])}: Prefect's CLI refuses it: {why}")
            elif name is not None:
                self.deployment_run(line, name)
        elif prog == "make" and len(argv) > 1 and not argv[1].startswith("-"):
            for target in argv[1:]:
                if "=" not in target and "<" not in target and target not in self.code.make_targets:
                    self.add(line, "command", f"make {target}: no such target in the Makefile")

    def miles_argv(self, line: int, args: list[str]) -> None:
        if not args or args[0].startswith("-"):
            return
        name = args[0]
        cmd = self.code.commands.get(name)
        if cmd is None:
            if not name.startswith("<"):
                self.add(line, "command", f"miles {name}: no such command (miles {', '.join(self.code.commands)})")
            return
        positional = [a for i, a in enumerate(args[1:]) if not a.startswith("-") and (i == 0 or not args[i].startswith("--") or "=" in args[i]
                                                                                       or self._is_switch(args[i]))]
        if name in ("train", "config") and positional:
            recipe = positional[0]
            if not (recipe.startswith(("<", "$")) or recipe.isupper() or recipe in self.code.recipes or (ROOT / recipe).is_file()
                    or recipe.endswith((".yaml", ".yml"))):
                self.add(line, "command", f"miles {name} {recipe}: no such recipe ({', '.join(sorted(self.code.recipes))}) or YAML file")
        if name == "recipe" and "--" in args:  # `miles recipe import [OPTIONS] -- <reference flags>`: read by the importer
            cut = args.index("--")
            for f in (a.split("=")[0] for a in args[cut + 1:]):
                if f.startswith("--") and f not in self.code.reference_flags:
                    self.add(line, "flag", f"{f} is not a flag `miles recipe import` knows (the reference's, ours, SGLang's)")
            args = args[:cut]
        for a in args[1:]:
            f = a.split("=")[0]
            passthrough = name in ("train", "config", "eval") and f in self.code.sglang_flags
            if f.startswith("--") and f not in cmd.flags and not passthrough:
                self.add(line, "flag", f"{f} is not a flag of miles {name}")
        self.flag_values(line, args[1:])

    def deployment_run(self, line: int, name: str) -> None:
        """`prefect deployment run <flow>/<deployment>`: a deployment of deployments/prefect.yaml."""
        if "<" in name or "$" in name or name in self.code.deployments:
            return
        near = difflib.get_close_matches(name, sorted(self.code.deployments), n=3, cutoff=0.5)
        hint = f"nearest: {', '.join(near)}" if near else f"it has {', '.join(sorted(self.code.deployments)[:4])}, ..."
        self.add(line, "command", f"prefect deployment run {name}: no such deployment in deployments/prefect.yaml ({hint})")

    def env_assignment(self, line: int, var: str, value: str) -> None:
        """`VAR=value`: a variable miles sets or reads (or a build argument), and a value its reader takes."""
        if var not in self.code.env and var not in EXTERNAL_ENV and var not in self.code.build_args:
            self.add(line, "env", f"{var} is not an env var miles sets or reads (miles_core/env.py, flows/env.py), nor a build argument "
                                  "of docker/Dockerfile*")
            return
        value = value.strip("'\"")
        if ENV_PLACEHOLDER.search(value) or var in EXTERNAL_ENV:
            return
        why = envvalues.problem(var, value)
        if why:
            self.add(line, "env", f"{var}={value}: not a value its reader takes; it says: {why}")

    def flag_values(self, line: int, words: list[str]) -> None:
        """`--flag value` / `--flag=value` pairs of config flags: the value must be valid for the field."""
        for i, word in enumerate(words):
            flag, eq, value = word.partition("=")
            field = self.code.flag_field.get(flag)
            if field is None or field.is_bool:
                continue
            if not eq:
                if i + 1 >= len(words) or words[i + 1].startswith("--"):
                    continue
                value = words[i + 1]
            if PLACEHOLDER_VALUE.search(value):
                continue
            why = facts.invalid_field_value(field.name, value)
            if why:
                self.add(line, "value", f"{flag} {value}: not a valid value of {field.name} ({why})")

    def _is_switch(self, flag: str) -> bool:
        f = self.code.flag_field.get(flag)
        return f is not None and f.is_bool

    # relative links: the file, and the anchor among the ids of the target page as mkdocs renders it
    def link(self, line: int, target: str) -> None:
        why = links.link_problem(self.page.path, target) if self.page.path is not None else None
        if why:
            self.add(line, "link", why)

    def run_block(self, b: Block) -> str:
        """Run a runnable block (or take its started run); -> its stdout + stderr (problems are recorded, not raised)."""
        returncode, out = self.started[b.line].result() if b.line in self.started else execute_block(b)
        if returncode is None:
            self.add(b.line, "run", f"runnable block timed out after {block_timeout(b)} s")
            return ""
        if returncode:
            tail = out.strip().splitlines()[-8:]
            self.add(b.line, "run", f"runnable block exited {returncode}:\n    " + "\n    ".join(tail))
        return out


def block_timeout(b: Block) -> int:
    return 300 if b.run == "slow" else 120


def execute_block(b: Block) -> tuple[int | None, str]:
    """Run a runnable shell block with bash -e -o pipefail from the repository root; -> (its exit status, None when it
    timed out; its stdout + stderr)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1"}
    try:
        r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", b.text], cwd=ROOT, env=env, text=True,
                           capture_output=True, timeout=block_timeout(b))
    except subprocess.TimeoutExpired:
        return None, ""
    return r.returncode, r.stdout + r.stderr


def _runs_here(b: Block, run: set[str]) -> bool:
    """Whether PageCheck.block runs ``b`` (a gpu block only parses)."""
    return b.is_shell and bool(b.run) and b.run != "gpu" and b.run in run


def _shell_lines(text: str) -> Iterable[tuple[int, str]]:
    """(offset, logical line) with backslash continuations joined and prompts stripped."""
    buf, start = "", 0
    for i, raw in enumerate(text.splitlines()):
        if not buf:
            start = i
        line = raw.rstrip()
        if line.startswith("$ "):
            line = line[2:]
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf.strip() and not buf.strip().startswith("#"):
            yield start, buf.strip()
        buf = ""
    if buf.strip():
        yield start, buf.strip()


def _split_commands(words: list[str]) -> list[list[str]]:
    out, cur = [], []
    for w in words:
        if w in ("&&", "||", ";", "|", "&"):
            out.append(cur)
            cur = []
        else:
            cur.append(w)
    out.append(cur)
    return [c for c in out if c]


# ---- the whole site ---------------------------------------------------------------------------------
def pages(docs: Path = DOCS, readme: Path | None = ROOT / "README.md") -> list[Page]:
    generated = {(docs / rel).resolve() for rel in PAGES}
    out = []
    for path in sorted(docs.rglob("*.md")):
        if path.resolve() in generated:
            continue  # correct by construction; the staleness check covers them
        out.append(parse(path.relative_to(docs.parent).as_posix(), path.read_text(encoding="utf-8"), path))
    if readme is not None and readme.is_file():
        out.append(parse(readme.name, readme.read_text(encoding="utf-8"), readme))
    return out


def check(docs: Path = DOCS, readme: Path | None = ROOT / "README.md", run: Iterable[str] = ("fast",)) -> list[Problem]:
    """Every problem of the docs under ``docs`` (and README.md). ``run``: which runnable blocks to run ("fast", "slow").

    The runnable blocks are independent commands (each its own bash from the repository root): they run two at a
    time, started before the rest of the check, and each page's problems are recorded in page order as before."""
    run = set(run)
    all_pages = pages(docs, readme)
    with ThreadPoolExecutor(max_workers=RUN_CONCURRENCY) as pool:
        started = {page.rel: {b.line: pool.submit(execute_block, b) for b in page.blocks if _runs_here(b, run)} for page in all_pages}
        code = Code()
        problems = [Problem(f"docs/{rel}", 1, "stale", f"generated page is stale: run `python -m tools.docs generate` (or make docs)")
                    for rel in stale(docs, render_all())]
        for page in all_pages:
            problems += PageCheck(page, code, run, started[page.rel]).check()
    return problems


def runnable_blocks(docs: Path = DOCS, readme: Path | None = ROOT / "README.md") -> list[tuple[str, Block]]:
    return [(p.rel, b) for p in pages(docs, readme) for b in p.blocks if b.run]

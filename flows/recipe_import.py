"""`miles recipe import`: a reference launch command -> a recipe file.

miles_core/reference_import.py reads the command and places every flag; here the values are checked as a recipe is
(the pure rules and the registry checks, over the base recipe), a value a rule refuses as not supported joins the
refused flags with the rule's message, the recipe keeps only what differs from the base, and the file is written.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flows.recipes import RECIPES_DIR, read_recipe
from miles_core import assemble
from miles_core import reference_import as ri
from miles_core.config import GROUPS, ConfigError
from miles_core.config.server_args import PREFIX


def _flat_json(values: Mapping[str, Any], source: str) -> dict[str, Any]:
    cfg = assemble.build_config(values, source)
    flat = {k: v for g in GROUPS for k, v in getattr(cfg, g).model_dump(mode="json").items()}
    flat.update({PREFIX + k: v for k, v in flat.pop("sglang_server_args").items()})
    return flat


def _named(key: str, text: str) -> re.Match | None:
    return re.search(rf"(?<![a-z_]){re.escape(key)}(?![a-z_])", text)


def _culprit(base_values: dict[str, Any], imported: ri.Imported, error: ConfigError, source: str) -> str | None:
    """The imported field whose value the refusal is about: one the message names (first named first) whose value, put
    back to the base's, clears that message without a problem of its own."""
    named = sorted((m.start(), key) for key in imported.values if (m := _named(key.removeprefix(PREFIX), str(error))))
    for _, key in named:
        rest = {k: v for k, v in imported.values.items() if k != key}
        try:
            _flat_json({**base_values, **rest}, source)
        except ConfigError as again:
            if str(again) == str(error) or _named(key, str(again)):
                continue
        return key
    return None


def validated(base_values: dict[str, Any], imported: ri.Imported, source: str) -> dict[str, Any]:
    """The resolved flat values of base + imported. A value a rule refuses as not supported moves to the refused flags with
    the rule's message; any other ConfigError (values that contradict each other) stands."""
    while True:
        try:
            return _flat_json({**base_values, **imported.values}, source)
        except ConfigError as e:
            culprit = _culprit(base_values, imported, e, source) if "not supported" in str(e) else None
            if culprit is None:
                raise
            reason = str(e).split("\n", 1)[-1].strip().removeprefix("- ").removeprefix("config: ")
            flag, value = "--" + culprit.replace("_", "-"), imported.values.pop(culprit)
            shown = "" if value is True else " ".join(map(str, value)) if isinstance(value, list) else str(value)
            imported.refused.append(ri.Refused(flag, f"{flag} {shown}".strip(), reason))


def import_command(argv: Sequence[str], base: str | None) -> ri.Imported:
    """A reference command's recipe values over ``base`` (a recipe name or YAML path; None: miles' defaults and the
    reference's setup, ``ri.REFERENCE_SETUP``); ``written`` holds those that differ from the base."""
    imported = ri.classify(argv)
    if not base:
        ri.apply_setup(imported)
    base_values = read_recipe(base) if base else {}
    resolved = validated(base_values, imported, f"imported command{f' over {base}' if base else ''}")
    base_resolved = _flat_json(base_values, f"recipe {base}") if base else ri.defaults()
    imported.written = {k: resolved[k] for k in imported.values if resolved.get(k) != base_resolved.get(k)}
    return imported


def _extends(base: str | None, out: Path) -> str | None:
    """``extends:`` as the written file reads it: a recipe name as is, a YAML path relative to the file's dir."""
    if base is None or Path(base).suffix not in (".yaml", ".yml") or not Path(base).is_file():
        return base
    return os.path.relpath(Path(base).absolute(), out.absolute().parent)


def run_import(argv: list[str], *, out: Path, base: str | None, from_file: str | None, model: str | None,
               allow_refused: bool, echo: Callable[[str], None]) -> int:
    """Write ``out`` and return 0; with refused flags and no ``allow_refused``, write nothing and return 2."""
    if from_file is not None:
        tokens = ri.shell_argv(Path(from_file).read_text(encoding="utf-8"), model) + ri.expand(argv, ri.model_arrays(model))
        source = from_file
    else:
        tokens, source = ri.expand(argv, ri.model_arrays(model)), "the command line"
    if not tokens:
        raise ri.ImportFailure("no reference flags given: pass them after `--`, or --from-file FILE")
    imported = import_command(tokens, base)
    for note in imported.notes:
        echo(f"note: {note}")
    if imported.model_spec:
        echo(f"model arguments: the named spec {imported.model_spec} (miles reads the model from hf_checkpoint's config.json)")
    for r in imported.refused:
        echo(f"refused: {r.given}: {r.reason}")
    if imported.refused and not allow_refused:
        echo(f"error: {len(imported.refused)} flag(s) cannot be honoured (listed above); nothing written. Drop them, or pass "
             "--allow-refused to write them as comments.")
        return 2
    out.write_text(ri.render(imported, _extends(base, out), source), encoding="utf-8")
    echo(f"wrote {out}: {len(imported.written)} values"
         + (f", {len(imported.refused)} refused flags as comments" if imported.refused else ""))
    return 0

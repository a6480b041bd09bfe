"""dumper_source_patcher_config_train: SGLang's source patcher (sglang.srt.debug_utils.source_patcher, 0.5.23) on
the trainer's code, so a function the non-intrusive hooks cannot see dumps what the YAML names:

    patches:
      - target: transformers.models.qwen2.modeling_qwen2.Qwen2MLP.forward   # a dotted path to a function
        edits:
          - match: "return down_proj"                                      # lines compared stripped; exactly once
            prepend: "dumper.dump('mlp_output', down_proj)"               # or append: / replacement: (one of them)
        preamble: ""                                                       # optional lines at the top of the body

As SGLang's: each edit replaces the matched lines (re-indented to the first one's indent), the source is dedented,
compiled in the function's module and its ``__code__`` replaced. SGLang's patcher puts
``from sglang.srt.debug_utils.dumper import dumper`` at the top of every patched body; here the body's first line
binds ``dumper`` to the trainer's dumper (training/dumps.py: enabled inside a phase scope only, so a patched
function called outside one dumps nothing). ``restore()`` puts the original code back.
"""

from __future__ import annotations

import __future__
import importlib
import inspect
import textwrap
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, model_validator

DUMPER_GLOBAL = "__miles_train_dumper__"  # the patched module's global the body's ``dumper`` is read from


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EditSpec(_Strict):
    match: str
    replacement: str = ""
    prepend: str = ""
    append: str = ""

    @model_validator(mode="after")
    def _one_mode(self) -> "EditSpec":
        active = [n for n in ("replacement", "prepend", "append") if getattr(self, n).strip()]
        if len(active) > 1:
            raise ValueError(f"only one of 'replacement', 'prepend', 'append' may be set, got: {', '.join(active)}")
        return self


class PatchSpec(_Strict):
    target: str
    edits: list[EditSpec]
    preamble: str = ""


class PatchConfig(_Strict):
    patches: list[PatchSpec]


def apply_edits(source: str, edits: list[EditSpec]) -> str:
    """The edits in order, each on the previous one's result."""
    for edit in edits:
        source = _apply_edit(source, edit)
    return source


def _apply_edit(source: str, edit: EditSpec) -> str:
    match = edit.match.strip()
    if not match:
        raise ValueError("source patch: empty match text")
    lines, wanted = source.splitlines(), [m.strip() for m in match.splitlines()]
    stripped = [line.strip() for line in lines]
    found = [i for i in range(len(lines) - len(wanted) + 1) if stripped[i : i + len(wanted)] == wanted]
    if len(found) != 1:
        raise ValueError(f"source patch: match text found {len(found)} times (must be exactly once):\n{match}")
    start = found[0]
    if edit.prepend.strip():
        new = edit.prepend.strip() + "\n" + match
    elif edit.append.strip():
        new = match + "\n" + edit.append.strip()
    else:
        new = edit.replacement.strip()
    indent = _indent(lines[start])
    out = lines[:start] + _realign(new.splitlines() if new else [], indent) + lines[start + len(wanted):]
    return "\n".join(out) + ("\n" if source.endswith("\n") else "")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _realign(lines: list[str], indent: int) -> list[str]:
    """The first non-empty line's indent becomes ``indent``, the others keep theirs relative to it."""
    non_empty = [line for line in lines if line.strip()]
    if not non_empty:
        return []
    base = _indent(non_empty[0])
    return ["" if not line.strip() else " " * indent + line[min(base, _indent(line)):] for line in lines]


def _insert_preamble(source: str, preamble: str) -> str:
    """Preamble lines at the body's first non-empty line after the signature (the first line ending with ':')."""
    lines = source.splitlines()
    start = next((i for i, line in enumerate(lines) if line.rstrip().endswith(":")), 0) + 1
    for i in range(start, len(lines)):
        if lines[i].strip():
            start = i
            break
    body = " " * _indent(lines[start])
    return "\n".join(lines[:start] + [body + p for p in preamble.strip().splitlines()] + lines[start:])


def resolve_target(name: str) -> Any:
    """'pkg.mod.Class.method' -> the function: the longest importable module prefix, then attributes."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:]:
            target = getattr(target, attr)
        target = getattr(target, "__func__", target)  # a classmethod / bound method: its function
        if not callable(target) or not hasattr(target, "__code__"):
            raise TypeError(f"source patch target {name!r} is not a function: {type(target).__name__}")
        return target
    raise ImportError(f"source patch target {name!r}: no module prefix of it imports")


def check_patch_file(misc) -> None:
    """At load: dumper_source_patcher_config_train needs dumper_enable (the reference applies it only then) and a YAML
    file of patches in the format above (their targets resolve when the trainer is built)."""
    path = misc.dumper_source_patcher_config_train
    if path is None:
        return
    if not misc.dumper_enable:
        raise ValueError("dumper_source_patcher_config_train applies only with dumper_enable (as the reference's); set it, "
                         "or drop dumper_source_patcher_config_train")
    if not Path(path).is_file():
        raise ValueError(f"dumper_source_patcher_config_train: {path} is not a file")
    try:
        PatchConfig.model_validate(yaml.safe_load(Path(path).read_text()))
    except (yaml.YAMLError, ValueError) as e:
        raise ValueError(f"dumper_source_patcher_config_train: {path} is not a source-patcher YAML ({e})") from None


class SourcePatches:
    """The patches of one YAML file, applied with ``dumper`` bound in each patched body; ``restore()`` undoes them."""

    def __init__(self, path: str | Path, dumper):
        config = PatchConfig.model_validate(yaml.safe_load(Path(path).read_text()))
        self.applied: list[tuple[Any, Any]] = []
        try:
            for spec in config.patches:
                self.applied.append(self._patch(spec, dumper))
        except BaseException:
            self.restore()
            raise

    @staticmethod
    def _patch(spec: PatchSpec, dumper) -> tuple[Any, Any]:
        fn = resolve_target(spec.target)
        source = textwrap.dedent(apply_edits(inspect.getsource(fn), spec.edits))
        preamble = f"dumper = {DUMPER_GLOBAL}\n" + spec.preamble
        code = compile(_insert_preamble(source, preamble), inspect.getfile(fn), "exec",
                       flags=__future__.annotations.compiler_flag, dont_inherit=True)
        fn.__globals__[DUMPER_GLOBAL] = dumper
        namespace: dict[str, Any] = {}
        exec(code, fn.__globals__, namespace)  # noqa: S102 (the user's own patch file, as SGLang's patcher)
        original = fn.__code__
        fn.__code__ = namespace[fn.__name__].__code__
        return fn, original

    def restore(self) -> None:
        for fn, original in reversed(self.applied):
            fn.__code__ = original
        self.applied.clear()

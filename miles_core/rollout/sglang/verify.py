"""The snapshot against a real SGLang parser: where SGLang is installed (the GPU images run this at build time).

    python -m miles_core.rollout.sglang.verify      # exit 1, listing each difference, if they disagree

The snapshot is read from the wheel's source without importing SGLang (tools/sglang_snapshot.py); this
imports the installed SGLang, builds its own ``argparse`` parser (``ServerArgs.add_cli_args``) and checks
every argument: the same flags, the same way of reading values (kind, nargs), the same value type, the
same default and choices. ``snapshot_parser()`` builds the parser the snapshot describes, with SGLang's
rules: the tests parse launch commands back with it, and compare it with this check on CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from miles_core.config.server_args import ServerArg, Snapshot, snapshot

# argparse type= callables by name -> the snapshot's value type (SGLang's parsers of text count as str)
VALUE_TYPES = {"int": "int", "float": "float", "str": "str", "loads": "json", "json_list_type": "json_list",
               "human_readable_int": "int", "nullable_str": "str"}
def json_list_type(text: str) -> list:
    """SGLang's parser of a JSON list argument (named as SGLang names it: VALUE_TYPES reads the name)."""
    return json.loads(text)


_CONVERT = {"int": int, "float": float, "str": str, "json": json.loads, "json_list": json_list_type}


def snapshot_parser(snap: Snapshot | None = None) -> argparse.ArgumentParser:
    """An ``argparse`` parser with every argument of the snapshot, built the way SGLang builds its own."""
    p = argparse.ArgumentParser(prog="sglang.launch_server (snapshot)", exit_on_error=False)
    for a in (snap or snapshot()).args.values():
        common = {"dest": a.name, "default": a.default, **({"choices": list(a.choices)} if a.choices is not None else {})}
        if a.kind == "store_true":
            p.add_argument(*a.flags, action="store_true", **common)
        elif a.kind == "boolean_optional":
            p.add_argument(*a.flags, action=argparse.BooleanOptionalAction, **common)
        elif a.kind == "list":
            p.add_argument(*a.flags, nargs=a.nargs, type=_CONVERT[a.type[5:-1]], **common)
        elif a.kind == "optional_value":
            p.add_argument(*a.flags, nargs="?", const="", **common)
        else:
            p.add_argument(*a.flags, type=_CONVERT[a.type], **common)
    return p


def _kind(action: argparse.Action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return "boolean_optional"
    if isinstance(action, argparse._StoreTrueAction) or (action.nargs == 0 and action.const is True):
        return "store_true"
    if type(action) is not argparse._StoreAction:  # a custom action taking values (LoRAPathAction)
        return "list"
    return {None: "value", "+": "list", "*": "list", "?": "optional_value"}[action.nargs]


def _value_type(action: argparse.Action) -> str:
    name = getattr(action.type, "__name__", "str") if action.type is not None else "str"
    return VALUE_TYPES.get(name, "str")


def _differences(arg: ServerArg, action: argparse.Action) -> list[str]:
    out, where = [], f"{arg.name} ({arg.flag})"
    flags = set(arg.flags) | ({"--no-" + arg.flag[2:]} if arg.kind == "boolean_optional" else set())
    if flags != set(action.option_strings):
        out.append(f"{where}: flags {sorted(flags)} in the snapshot, {sorted(action.option_strings)} in SGLang")
    kind = _kind(action)
    if kind != arg.kind:
        out.append(f"{where}: read as {arg.kind} in the snapshot, {kind} in SGLang")
    elif kind in ("value", "list", "optional_value") and type(action) is argparse._StoreAction:
        inner = arg.type[5:-1] if arg.type.startswith("list[") else arg.type
        if _value_type(action) != inner:
            out.append(f"{where}: type {inner} in the snapshot, {_value_type(action)} in SGLang")
        if kind == "list" and action.nargs != arg.nargs:
            out.append(f"{where}: nargs {arg.nargs} in the snapshot, {action.nargs} in SGLang")
    if _plain(action.default) != arg.default and not (arg.default is None and action.default is None):
        out.append(f"{where}: default {arg.default!r} in the snapshot, {action.default!r} in SGLang")
    if arg.choices is not None and action.choices is not None and sorted(map(str, arg.choices)) != sorted(map(str, action.choices)):
        out.append(f"{where}: choices differ ({len(arg.choices)} in the snapshot, {len(action.choices)} in SGLang)")
    return out


def _plain(value: Any) -> Any:
    return sorted(value) if isinstance(value, (set, frozenset)) else list(value) if isinstance(value, tuple) else value


def compare(parser: argparse.ArgumentParser, snap: Snapshot | None = None) -> list[str]:
    """Every difference between a parser of ``sglang.launch_server`` and the snapshot; [] when they agree."""
    snap = snap or snapshot()
    out, seen = [], set()
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        if snap.spellings.get(action.option_strings[0][2:].replace("-", "_")) == action.dest and action.dest in seen:
            continue  # a second registration of a field (a deprecated spelling)
        arg = snap.args.get(action.dest)
        if arg is None or not set(arg.flags) & set(action.option_strings):
            if action.option_strings[0][2:].replace("-", "_") in snap.spellings:
                continue  # a deprecated spelling of a field the snapshot has
            out.append(f"{action.dest} ({action.option_strings[0]}): in SGLang, not in the snapshot")
            continue
        seen.add(action.dest)
        out += _differences(arg, action)
    out += [f"{name} ({snap.args[name].flag}): in the snapshot, not in SGLang" for name in sorted(set(snap.args) - seen)]
    return out


def main() -> int:
    from sglang.srt.server_args import ServerArgs  # this module's one import of SGLang

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    problems = compare(parser)
    snap = snapshot()
    for line in problems:
        print(line)
    print(f"sglang {snap.version} snapshot vs the installed SGLang's parser: "
          f"{'agree' if not problems else f'{len(problems)} differences (make sglang-snapshot)'} ({len(snap.args)} arguments)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

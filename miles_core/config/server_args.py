"""SGLang server arguments as miles passes them through: the committed snapshot, validation, CLI form.

The snapshot (``server_args.json``, written by ``make sglang-snapshot`` = ``python -m
tools.sglang_snapshot`` from the pinned wheel's source, never importing sglang) lists every argument
of ``python -m sglang.launch_server``: field name, flags, how argparse reads it (``kind``), value type,
default, choices. A passthrough is a config key ``sglang_<field>`` (CLI ``--sglang-<flag>``), kept in
``sglang_server_args`` as ``{field: value}``:

    sglang_mem_fraction_static: 0.7      ->  --mem-fraction-static 0.7
    sglang_enable_metrics: true          ->  --enable-metrics              (store_true)
    sglang_enable_mixed_chunk: false     ->  (nothing: the default)
    sglang_cuda_graph_bs_decode: [1, 2]  ->  --cuda-graph-bs-decode 1 2   (nargs +)

Keys are checked at load: an unknown one fails naming the nearest real ones; a value of the wrong
type (or outside closed choices) fails naming the key; an argument that miles sets itself (OWNED)
fails naming the miles field that controls it.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

SNAPSHOT = Path(__file__).with_name("server_args.json")
PREFIX = "sglang_"

# Server arguments miles sets itself for every engine: a passthrough of one is refused with the reason.
OWNED = {
    "model_path": "miles passes the engine's model dir (hf_checkpoint, resolved)",
    "tp_size": "set rollout_num_gpus_per_engine (the engine's tensor parallel size)",
    "host": "miles binds each engine to its node's address",
    "port": "miles picks a free port per engine",
    "api_key": "miles generates one API key per run",
    "nnodes": "an engine's nodes follow from rollout_num_gpus_per_engine and the placement",
    "node_rank": "an engine's nodes follow from rollout_num_gpus_per_engine and the placement",
    "dist_init_addr": "an engine's nodes follow from rollout_num_gpus_per_engine and the placement",
    "base_gpu_id": "each engine actor sees its own GPUs (CUDA_VISIBLE_DEVICES)",
    "gpu_id_step": "each engine actor sees its own GPUs (CUDA_VISIBLE_DEVICES)",
    "nccl_port": "miles picks the engine's ports",
    "enable_memory_saver": "miles sets it when colocate is true (memory is released around training)",
    "random_seed": "set seed (miles gives each engine seed + its index)",
    "config": "not supported yet: the reference's --sglang-config (a deployment file) has no miles equivalent",
}
# reference flags named like passthroughs that are not SGLang server arguments
NOT_SERVER_ARGS = {
    "server_concurrency": "--sglang-server-concurrency (the reference's cap of requests in flight per engine) is not supported yet",
}


class PassthroughError(ValueError):
    """A ``sglang_*`` key or value that SGLang's pinned version would not take; the message names the key."""


@dataclass(frozen=True)
class ServerArg:
    """One ``python -m sglang.launch_server`` argument, as the snapshot records it.

    kind: store_true (flag, on only) | boolean_optional (--x / --no-x) | value (flag + one value) |
    list (flag + values, nargs + or *) | optional_value (flag alone = const, or flag + value).
    type: bool | int | float | str | json (any JSON, passed as JSON text) | json_list | list[int|float|str].
    """

    name: str
    flags: tuple[str, ...]
    kind: str
    type: str
    default: Any
    nullable: bool
    choices: tuple[Any, ...] | None
    choices_open: bool  # a named list SGLang plugins may extend: recorded, not enforced
    nargs: str | None
    help: str
    deprecated: str | None
    namespace: str  # SGLang's group of the argument (serving, parallel, ...)

    @property
    def flag(self) -> str:
        return self.flags[0]

    @property
    def miles_flag(self) -> str:
        """The passthrough flag of miles' CLI: ``--sglang-`` + the SGLang flag's stem."""
        return "--sglang-" + self.flag[2:]


@dataclass(frozen=True)
class Snapshot:
    version: str
    args: dict[str, ServerArg]  # by field name
    spellings: dict[str, str]  # every accepted name (field, flag stems with _, deprecated spellings) -> field


@lru_cache(maxsize=1)
def snapshot() -> Snapshot:
    data = json.loads(SNAPSHOT.read_text())
    args = {}
    for name, e in data["fields"].items():
        args[name] = ServerArg(
            name=name, flags=tuple(e["flags"]), kind=e["kind"], type=e["type"], default=e.get("default"),
            nullable=e.get("nullable", False), choices=tuple(e["choices"]) if e.get("choices") is not None else None,
            choices_open=e.get("choices_open", False), nargs=e.get("nargs"), help=e.get("help", ""),
            deprecated=e.get("deprecated") if isinstance(e.get("deprecated"), str) else None, namespace=e["namespace"])
    spellings = {f[2:].replace("-", "_"): a.name for a in args.values() for f in a.flags}
    spellings.update({f[2:].replace("-", "_"): field for f, field in data.get("deprecated_spellings", {}).items()})
    spellings.update({n: n for n in args})
    return Snapshot(version=data["sglang_version"], args=args, spellings=spellings)


def cli_flags() -> set[str]:
    """Every ``--sglang-*`` passthrough flag miles' CLI takes (the docs check allows these)."""
    snap = snapshot()
    flags = {"--sglang-" + s.replace("_", "-") for s, field in snap.spellings.items() if field not in OWNED}
    flags |= {"--sglang-no-" + a.flag[2:] for a in snap.args.values() if a.kind == "boolean_optional" and a.name not in OWNED}
    return flags


def _shown(key: str) -> str:
    return f"{PREFIX}{key} (--sglang-{key.replace('_', '-')})"


def resolve(key: str) -> ServerArg:
    """``mem_fraction_static`` (or a flag stem, ``tensor_parallel_size``) -> its argument. Raises
    PassthroughError naming ``sglang_<key>`` and the nearest real arguments."""
    snap = snapshot()
    shown = _shown(key)
    if key in NOT_SERVER_ARGS:
        raise PassthroughError(f"{shown}: {NOT_SERVER_ARGS[key]}")
    field = snap.spellings.get(key)
    if field is None:
        close = difflib.get_close_matches(key, list(snap.args), n=3, cutoff=0.6)
        hint = f"; nearest: {', '.join(_shown(c) for c in close)}" if close else ""
        raise PassthroughError(f"{shown} is not a server argument of SGLang {snap.version}{hint} "
                               f"(the list: docs/reference/sglang.md)")
    if field in OWNED:
        raise PassthroughError(f"{shown}: miles sets --{field.replace('_', '-')} itself: {OWNED[field]}")
    return snap.args[field]


def _type_problem(arg: ServerArg, value: Any) -> str | None:
    """None if ``value`` fits ``arg``; else what was expected."""
    scalar = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}
    if arg.type in scalar:
        ok = isinstance(value, scalar[arg.type]) and not (arg.type != "bool" and isinstance(value, bool))
        return None if ok else f"expected {arg.type}"
    if arg.type.startswith("list["):
        inner = scalar[arg.type[5:-1]]
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, inner) for v in value):
            return f"expected a list of {arg.type[5:-1]}"
        if not value and arg.nargs == "+":
            return "expected at least one value (nargs +)"
        return None
    if arg.type == "json_list":
        return None if isinstance(value, (list, str)) else "expected a list (or its JSON text)"
    try:  # json
        json.dumps(value)
    except (TypeError, ValueError):
        return "expected a JSON value"
    return None


def check_value(arg: ServerArg, value: Any) -> Any:
    """The value if SGLang's CLI can take it; raises PassthroughError naming ``sglang_<field>``."""
    key = PREFIX + arg.name
    if value is None:
        if arg.default is None:
            return None
        raise PassthroughError(f"{key}: null is not a value of {arg.flag} (default {arg.default!r}); drop the key instead")
    if arg.kind == "optional_value" and value is True:
        return value
    problem = _type_problem(arg, value)
    if problem:
        raise PassthroughError(f"{key}: {problem} for {arg.flag}, got {value!r} ({type(value).__name__})")
    if arg.kind == "store_true" and value is False and arg.default:
        raise PassthroughError(f"{key}: {arg.flag} is a store_true flag defaulting to on; SGLang's CLI cannot turn it off")
    if arg.choices is not None and not arg.choices_open:
        bad = [v for v in (value if isinstance(value, list) else [value]) if v not in arg.choices]
        if bad:
            raise PassthroughError(f"{key}: {bad[0]!r} is not one of {list(arg.choices)}")
    return value


def validate(values: Mapping[str, Any]) -> dict[str, Any]:
    """``{field or flag stem: value}`` -> ``{field: value}``, every key and value checked (see module doc)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        arg = resolve(str(key).removeprefix(PREFIX))
        if arg.name in out:
            raise PassthroughError(f"{PREFIX}{key}: {arg.flag} is given twice (as {PREFIX}{arg.name} too)")
        out[arg.name] = check_value(arg, value)
    return out


def to_argv(name: str, value: Any) -> list[str]:
    """One passthrough in the CLI form SGLang's argparse reads. ``value`` was validated."""
    arg = snapshot().args[name]
    if value is None:
        return []
    if arg.kind == "store_true":
        return [arg.flag] if value else []
    if arg.kind == "boolean_optional":
        return [arg.flag if value else "--no-" + arg.flag[2:]]
    if arg.kind == "optional_value" and (value is True or value == ""):
        return [arg.flag]
    if arg.kind == "list":
        return [arg.flag, *(_text(v) for v in value)]
    if arg.type in ("json", "json_list") and not isinstance(value, str):
        return [arg.flag, json.dumps(value)]
    return [arg.flag, _text(value)]


def _text(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def parse_cli(argv: list[str]) -> dict[str, Any]:
    """miles' CLI passthrough flags -> ``{field: value}``, read the way SGLang's argparse reads them
    (a store_true flag takes no value, a list takes the values up to the next flag; text stays text for
    str and JSON arguments, numbers are parsed), then validated. Raises PassthroughError."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        flag = argv[i]
        if not flag.startswith("--sglang-"):
            raise PassthroughError(f"unexpected argument {flag!r}: passthrough flags read --sglang-<server argument> [value]")
        stem, eq, inline = flag[len("--sglang-"):].partition("=")
        negated = stem.startswith("no-") and snapshot().spellings.get(stem[3:].replace("-", "_")) is not None
        arg = resolve((stem[3:] if negated else stem).replace("-", "_"))
        values = [inline] if eq else []
        i += 1
        if arg.kind not in ("store_true", "boolean_optional") and not eq:
            while i < len(argv) and not argv[i].startswith("--") and (arg.kind == "list" or not values):
                values.append(argv[i])
                i += 1
        out[arg.name] = _cli_value(arg, negated, values)
    return validate(out)


def _cli_value(arg: ServerArg, negated: bool, values: list[str]) -> Any:
    if arg.kind in ("store_true", "boolean_optional"):
        if negated and arg.kind != "boolean_optional":
            raise PassthroughError(f"{arg.miles_flag} is a store_true flag: there is no --sglang-no-{arg.flag[2:]}")
        return not negated
    if arg.kind == "list":
        return [_number(v) if arg.type in ("list[int]", "list[float]") else v for v in values]
    if not values:
        if arg.kind == "optional_value":
            return True
        raise PassthroughError(f"{arg.miles_flag} needs a value")
    return _number(values[0]) if arg.type in ("int", "float") else values[0]


def _number(text: str) -> Any:
    """"4" -> 4, "0.7" -> 0.7, "1e-3" -> 0.001; other text stays text (validation names the field)."""
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text

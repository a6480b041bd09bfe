"""A reference launch command -> a miles recipe (``miles recipe import``; docs/guide/coming-from-the-reference.md).

The command is read the way the reference's ``train.py`` reads it: every flag of its own by its name, type and action
(config/reference/flags.tsv), a flag given twice keeps its last value (argparse; ``append`` flags collect), then
each flag is placed:

1. one of our fields (``--rollout-batch-size``), or the reference's name of one (``ALIASES``); a field that
   ``rules.NOT_SUPPORTED`` refuses is refused with that reason;
2. a reference flag we do not honour: refused with its reason from the compat table (``reference_flags.refusal``);
3. ``--sglang-<argument>``: an SGLang passthrough, read and checked against the pinned SGLang snapshot
   (config/server_args.py);
4. the Megatron model arguments (``${MODEL_ARGS[@]}``): matched against the named specs (``miles model-args``);
   miles reads the model from ``hf_checkpoint``'s config.json, so a match is a comment of the recipe, a model that
   matches no named spec (or a kernel setting other than the spec's) is refused;
5. a Megatron-LM flag the reference's launchers pass that is not a field (``MEGATRON_LM``): accepted where it is
   what miles does anyway, refused with the reason otherwise;
6. anything else: an error naming the flag and the nearest known one.

flows/recipe_import.py then checks the values as a recipe is (the pure rules and the registry checks, over the base);
a value a rule refuses (``--context-parallel-size 2``) is refused with the rule's message. The recipe (``render``)
holds only the values that differ from the base (``extends: <base>``) or, without a base, from the defaults (with the
reference's fixed setup, ``REFERENCE_SETUP``, where the command does not say).
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import yaml

from miles_core.config import GROUPS, ConfigError
from miles_core.config import server_args
from miles_core.config.reference_flags import ALIASES, FLAGS_TSV, refusal
from miles_core.config.rules import NOT_SUPPORTED
from miles_core.training.megatron import model_args as margs


class ImportFailure(ConfigError):
    """A command that cannot be imported at all (an unknown flag, a value the flag's type refuses); names the flag."""


@dataclass(frozen=True)
class RefFlag:
    """One row of flags.tsv: the reference's own flag (kind add) or a Megatron-LM flag it re-defaults (reset)."""

    flag: str
    kind: str
    group: str
    type: str
    default: str
    action: str


@lru_cache(maxsize=1)
def reference_table() -> dict[str, RefFlag]:
    rows = [line.split("\t") for line in FLAGS_TSV.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")]
    return {r[0]: RefFlag(r[0], r[1], r[2], r[3], r[4], r[5].strip("'")) for r in rows[1:]}


# Megatron-LM flags (not the reference's own) its launchers pass: flag -> (the values that are what miles does anyway,
# None = any / a switch; the note). A value outside the accepted ones is refused with the note.
_NO_DROPOUT = "the megatron trainer builds its model with hidden_dropout and attention_dropout 0 (miles_core/training/megatron/model.py)"
_CPU_ADAM = "the optimizer's CPU offload is not supported yet: the megatron trainer keeps the optimizer on the training device"
MEGATRON_LM: dict[str, tuple[tuple[str, ...] | None, bool, str]] = {  # flag -> (accepted values, accepted at all, note)
    "--attention-dropout": (("0", "0.0"), True, _NO_DROPOUT),
    "--hidden-dropout": (("0", "0.0"), True, _NO_DROPOUT),
    "--accumulate-allreduce-grads-in-fp32": (None, True, "gradients are always accumulated and reduced in fp32 (grad_reduce_in_fp32)"),
    "--attention-softmax-in-fp32": (None, True, "the megatron trainer always computes the attention softmax in fp32"),
    "--optimizer": (("adam",), True, "the trainer's optimizer is Adam (decoupled weight decay: weight_decay)"),
    "--lr-decay-style": (("constant",), True, "the schedule is a linear warm-up (lr_warmup_iters) to lr, then constant: no decay"),
    "--attention-backend": ((), False, "not a setting: the megatron trainer picks its layer spec's attention (Transformer Engine's on "
                                       "CUDA when it imports, else megatron-core's local spec; miles_core/training/megatron/model.py)"),
    "--moe-enable-deepep": ((), False, "DeepEP is not supported: the megatron trainer dispatches tokens with megatron-core's alltoall "
                                       "dispatcher"),
    "--optimizer-cpu-offload": ((), False, _CPU_ADAM),
    "--overlap-cpu-optimizer-d2h-h2d": ((), False, _CPU_ADAM),
    "--use-precision-aware-optimizer": ((), False, "megatron-core's precision-aware optimizer is not used: the main weights and Adam "
                                                   "moments stay fp32"),
}
_KERNELS = ("a kernel setting of the Megatron model other than the named spec's: the megatron trainer sets its own (MoE tokens "
            "through megatron-core's alltoall dispatcher, miles_core/training/megatron/model.py)")
# What the reference's train.py always does (or defaults to) where miles' default differs: applied to an import without a
# base (a base decides them itself), each with a note. field -> (value, why)
REFERENCE_SETUP: dict[str, tuple[Any, str]] = {
    "runtime": ("ray", "the reference always runs on Ray"),
    "train_backend": ("megatron", "the reference's default --train-backend"),
    "rollout_engine": ("sglang", "the reference's rollout engines are SGLang servers"),
    "device": ("cuda", "the reference trains and generates on GPUs"),
    "actor_num_gpus_per_node": (8, "the reference's default --actor-num-gpus-per-node"),
}
# reference flags (not fields of ours) whose effect is what miles always does: accepted with the note
SAME_BEHAVIOUR = {"--use-mlflow": "MLflow is miles' primary tracker, always on"}
# a reference value of one of our fields that is spelled otherwise here: (field, reference value) -> ours
VALUE_ALIASES: dict[tuple[str, Any], Any] = {("train_backend", "fsdp"): "torch"}  # the torch trainer is FSDP2 (or DDP)
# what a reference built-in's dotted path is called here (the reference's package is ``miles``, ours ``miles_core``)
REFERENCE_BUILTINS = {
    "miles.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std": "check_reward_nonzero_std",
}


SECRETS = ("--wandb-key",)  # flags whose value is a credential: never echoed nor written


def _given(flag: str, values: Sequence[str]) -> str:
    return f"{flag} <redacted>" if flag in SECRETS and values else " ".join([flag, *values])


@dataclass(frozen=True)
class Refused:
    flag: str
    given: str  # the flag and its values as given
    reason: str


@dataclass
class Imported:
    """What a command became. ``values``: our flat field names -> values (every flag that maps, before comparing with
    the base); ``written``: the part that differs from the base, as the recipe holds it."""

    values: dict[str, Any] = field(default_factory=dict)
    written: dict[str, Any] = field(default_factory=dict)
    refused: list[Refused] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    model_spec: str | None = None


# ---- text -> argv ------------------------------------------------------------------------------------------------

_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_MODEL_LINE = re.compile(r"(?:scripts/models/([\w.\-]+)\.(?:sh|py)|scripts/model_args\.py\s+([\w.\-]+))")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(\[@\])?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_TRAIN_SCRIPTS = ("train.py", "train_async.py")


def model_arrays(model: str | None) -> dict[str, list[str]]:
    """``MODEL_ARGS`` of a named spec, as the reference's ``scripts/models/<name>`` defines it."""
    if model is None:
        return {}
    try:
        margs.named(model)  # an unknown name: ValueError listing the valid ones
        return {"MODEL_ARGS": [t for flag in margs.reference_flags(model) for t in shlex.split(flag)]}
    except ValueError as e:
        raise ImportFailure(f"--model {model}: {e}") from None


def expand(tokens: Sequence[str], arrays: Mapping[str, list[str]]) -> list[str]:
    """``${NAME[@]}`` / ``$NAME`` tokens replaced by the array's (or value's) words; an undefined one is an error."""
    out: list[str] = []
    for token in tokens:
        m = _VAR.fullmatch(token)
        if not m:
            out.append(token)
            continue
        name = m.group(1) or m.group(3)
        if name not in arrays:
            hint = " (name the model's spec with --model NAME, see `miles model-args`)" if name == "MODEL_ARGS" else ""
            raise ImportFailure(f"{token}: {name} is not defined in the command{hint}")
        out.extend(arrays[name])
    return out


def shell_argv(text: str, model: str | None = None) -> list[str]:
    """A launch script's text -> the flags it passes to ``train.py``: ``\\`` continuations joined, comments dropped,
    ``NAME=( ... )`` arrays and ``NAME=value`` assignments recorded and expanded, ``MODEL_ARGS`` from the named spec
    (``--model``, or the script's own ``source scripts/models/<name>.sh`` / ``scripts/model_args.py <name>`` line)."""
    text = text.replace("\\\n", " ")
    arrays: dict[str, list[str]] = {}
    words: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if model is None and (m := _MODEL_LINE.search(line)):
            model = m.group(1) or m.group(2)
            model_arrays(model)  # an unknown spec is refused, naming the valid ones
            continue
        if (m := _ASSIGN.match(line)) and m.group(2).lstrip().startswith("("):
            body = m.group(2).lstrip()[1:]
            while ")" not in _strip_comment(body) and i < len(lines):
                body += "\n" + lines[i]
                i += 1
            inner = _strip_comment(body).rsplit(")", 1)[0]
            arrays[m.group(1)] = expand(shlex.split(inner, comments=True), {**model_arrays(model), **arrays})
            continue
        line_words = shlex.split(line, comments=True)
        if any(w.endswith(_TRAIN_SCRIPTS) for w in line_words) or line_words[:1] and line_words[0].startswith(("-", "$")):
            words += line_words  # the command's flags; another shell statement (cd, export, read, ray start) is not
        elif m := _ASSIGN.match(line):
            arrays[m.group(1)] = shlex.split(m.group(2), comments=True)
    starts = [k for k, w in enumerate(words) if w.endswith(_TRAIN_SCRIPTS)]
    if starts:
        words = words[starts[-1] + 1:]
    return expand(words, {**model_arrays(model), **arrays})


def _strip_comment(text: str) -> str:
    return "\n".join(line.split(" #")[0] if not line.lstrip().startswith("#") else "" for line in text.splitlines())


# ---- argv -> flags -----------------------------------------------------------------------------------------------

def split_flags(argv: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``--a 1 --b --c x y`` -> [("--a", ["1"]), ("--b", []), ("--c", ["x", "y"])]; ``--a=1`` is ("--a", ["1"])."""
    out: list[tuple[str, list[str]]] = []
    for token in argv:
        if token.startswith("--") and len(token) > 2:
            flag, eq, inline = token.partition("=")
            out.append((flag, [inline] if eq else []))
        elif not out:
            raise ImportFailure(f"unexpected {token!r} before the first flag: a reference command is --flag [value ...] ...")
        else:
            out[-1][1].append(token)
    return out


def _fields() -> dict[str, Any]:
    return {n: f for model in GROUPS.values() for n, f in model.model_fields.items()}


def _is_bool(annotation: Any) -> bool:
    return annotation is bool or (bool in getattr(annotation, "__args__", ()) and len(annotation.__args__) <= 2)


def _is_list(annotation: Any) -> bool:
    return "list" in str(annotation)


def _typed(text: str, kind: str) -> Any:
    if kind in ("int", "float"):
        try:
            return int(text) if kind == "int" else float(text)
        except ValueError:
            return text  # the field's validation names it
    if kind == "str":
        return text
    if kind == "json.loads":
        try:
            return json.loads(text)
        except ValueError:
            raise ImportFailure(f"{text!r} is not JSON (the reference reads this flag with json.loads)") from None
    return server_args._number(text) if text not in ("true", "false", "True", "False") else text.lower() == "true"


def _value(flag: str, values: list[str], annotation: Any, ref: RefFlag | None) -> Any:
    """The flag's values read with the reference's type and action (else our field's type)."""
    action = ref.action if ref else ""
    if action in ("store_true", "store_false") or (not ref and _is_bool(annotation)):
        if values:
            raise ImportFailure(f"{flag} is a switch (action {action or 'store_true'}): it takes no value, got {' '.join(values)!r}")
        return True  # our field has the flag's name: given = on (a store_false flag's dest is the reference's inverse name)
    if not values:
        raise ImportFailure(f"{flag} needs a value")
    kind = ref.type if ref else ""
    typed = [_typed(v, kind) for v in values]
    return typed if len(typed) > 1 or _is_list(annotation) else typed[0]


def _model_vocab() -> tuple[set[str], set[str]]:
    """(flags of a model's math, flags of the specs' kernel settings) as the reference's MODEL_ARGS write them."""
    from dataclasses import fields as dc_fields

    math = {"--" + f.name.replace("_", "-") for f in dc_fields(margs.ModelArgs)}
    math |= {"--swiglu", "--disable-bias-linear", "--normalization", "--position-embedding-type", "--group-query-attention"}
    style = {f.split()[0] for s in margs.STYLES.values() for f in (*s.extra, *s.implicit)} - math
    style |= {"--moe-token-dispatcher-type"}
    return math, style


def _spec_flags(name: str) -> dict[str, str]:
    return {flag: " ".join(v) for flag, v in split_flags([t for f in margs.reference_flags(name) for t in shlex.split(f)])}


def _norm(text: str) -> str:
    try:
        return repr(float(text))
    except ValueError:
        return text


def _match_model(given: dict[str, str], imported: Imported) -> None:
    """Model arguments -> the named spec they are (a comment of the recipe), else refused."""
    math, _ = _model_vocab()
    want = {k: _norm(v) for k, v in given.items() if k in math}
    if want:
        scores = []
        for name in margs.NAMED:
            spec = {k: _norm(v) for k, v in _spec_flags(name).items() if k in math}
            diff = sorted(k for k in want.keys() | spec.keys() if want.get(k) != spec.get(k))
            scores.append((len(diff), name, diff))
        n, name, diff = min(scores)
        if n:
            imported.refused.append(Refused("MODEL_ARGS", " ".join(f"{k} {v}".strip() for k, v in given.items() if k in math),
                                            f"the model arguments match no named spec (nearest {name}, differing in {', '.join(diff)}); "
                                            "miles reads the model from hf_checkpoint's config.json (`miles model-args` lists the specs)"))
        else:
            imported.model_spec = name
    spec_style = _spec_flags(imported.model_spec) if imported.model_spec else {}
    for flag, value in given.items():
        if flag in math:
            continue
        if imported.model_spec and flag in spec_style and _norm(spec_style[flag]) == _norm(value):
            continue  # the named spec's own kernel setting
        imported.refused.append(Refused(flag, f"{flag} {value}".strip(), _KERNELS))


def _note_repeats(flags: list[tuple[str, list[str]]], imported: Imported) -> list[tuple[str, list[str]]]:
    """Last wins, as argparse does (an ``append`` flag collects); a note names each repeated flag."""
    table, last = reference_table(), {}
    for flag, values in flags:
        ref = table.get(flag)
        if flag in last and ref and ref.action == "append":
            last[flag] = [*last[flag], *values]
            continue
        if flag in last and last[flag] != values:
            now, was = (("<redacted>",) * 2) if flag in SECRETS else (" ".join(values) or "on", " ".join(last[flag]) or "on")
            imported.notes.append(f"{flag} is given twice: the last value ({now}) wins, as the reference's argparse reads it "
                                  f"(the earlier {was} is dropped)")
        last.pop(flag, None)
        last[flag] = values
    return list(last.items())


def known_flags() -> list[str]:
    """Every flag a command may hold: the reference's, our fields', the model arguments', MEGATRON_LM's, SGLang's."""
    math, style = _model_vocab()
    return sorted({"--" + n.replace("_", "-") for n in _fields()} | set(reference_table()) | set(MEGATRON_LM) | math | style
                  | server_args.cli_flags())


def unknown(flag: str) -> ImportFailure:
    close = difflib.get_close_matches(flag, known_flags(), n=1, cutoff=0.5)
    hint = f"; the nearest known flag is {close[0]}" if close else ""
    return ImportFailure(f"unknown flag {flag}: neither a reference flag, a miles field, an SGLang server argument nor a "
                         f"Megatron model argument{hint}")


def classify(argv: Sequence[str]) -> Imported:
    """argv -> our values, SGLang passthroughs, the model spec, refusals and notes (module docstring, steps 1-6)."""
    fields, table, imported = _fields(), reference_table(), Imported()
    math, style = _model_vocab()
    model: dict[str, str] = {}
    for flag, values in _note_repeats(split_flags(argv), imported):
        name, given = flag[2:].replace("-", "_"), _given(flag, values)
        if name.startswith("no_") and not values and (
                (name[3:] in fields and _is_bool(fields[name[3:]].annotation))
                or getattr(table.get("--" + flag[5:]), "action", "") == "BooleanOptionalAction"):
            name, flag, negated = name[3:], "--" + flag[5:], True
        else:
            negated = False
        target = ALIASES.get(name, name)
        if target in fields:
            if target in NOT_SUPPORTED:
                imported.refused.append(Refused(flag, given, NOT_SUPPORTED[target]))
                continue
            value = False if negated else _value(flag, values, fields[target].annotation, table.get(flag))
            if isinstance(value, str) and (target, value) in VALUE_ALIASES:
                imported.notes.append(f"{given}: here {target} {VALUE_ALIASES[target, value]}")
                value = VALUE_ALIASES[target, value]
            if isinstance(value, str) and value in REFERENCE_BUILTINS:
                imported.notes.append(f"{flag} {value}: the reference's built-in, here {REFERENCE_BUILTINS[value]}")
                value = REFERENCE_BUILTINS[value]
            imported.values[target] = value
        elif flag in math or flag in style:
            model[flag] = " ".join(values)
        elif flag in SAME_BEHAVIOUR and not values:
            imported.notes.append(f"{flag}: {SAME_BEHAVIOUR[flag]}")
        elif why := refusal(name, frozenset(fields)):
            imported.refused.append(Refused(flag, given, why))
        elif flag in MEGATRON_LM:
            accepted, ok, note = MEGATRON_LM[flag]
            if ok and (accepted is None or " ".join(values) in accepted):
                imported.notes.append(f"{given}: {note}")
            else:
                imported.refused.append(Refused(flag, given, note))
        elif flag.startswith("--sglang-"):
            _passthrough(flag, values, imported)
        else:
            raise unknown(flag)
    if model:
        _match_model(model, imported)
    _attention_dp(imported)
    return imported


def _attention_dp(imported: Imported) -> None:
    """``--sglang-enable-dp-attention --sglang-dp-size N`` (the reference's pages) is ``--attn-dp-size N`` in the pinned SGLang,
    which deprecates the former for the latter (the snapshot's ``deprecated`` entry of enable_dp_attention)."""
    v, p = imported.values, server_args.PREFIX
    if v.get(p + "enable_dp_attention") is True and isinstance(v.get(p + "dp_size"), int) and "attn_dp_size" in server_args.snapshot().args:
        del v[p + "enable_dp_attention"]
        imported.notes[:] = [n for n in imported.notes if not n.startswith("--sglang-enable-dp-attention: deprecated")]
        v[p + "attn_dp_size"] = v.pop(p + "dp_size")
        imported.notes.append(f"--sglang-enable-dp-attention --sglang-dp-size {v[p + 'attn_dp_size']}: written as sglang_attn_dp_size "
                              f"{v[p + 'attn_dp_size']} (SGLang {server_args.snapshot().version} deprecates the former for it)")


def _passthrough(flag: str, values: list[str], imported: Imported) -> None:
    stem = flag[len("--sglang-"):]
    spelled = stem.removeprefix("no-").replace("-", "_")
    if spelled not in server_args.snapshot().spellings:
        raise unknown(flag)
    try:
        for key, value in server_args.parse_cli([flag, *values]).items():
            arg = server_args.snapshot().args[key]
            if arg.deprecated:
                imported.notes.append(f"{flag}: deprecated in SGLang {server_args.snapshot().version} (use {arg.deprecated})")
            imported.values[server_args.PREFIX + key] = value
    except server_args.PassthroughError as e:
        imported.refused.append(Refused(flag, _given(flag, values), str(e)))


# ---- a recipe ------------------------------------------------------------------------------------------------------

def apply_setup(imported: Imported) -> None:
    """An import without a base: the reference's fixed setup (``REFERENCE_SETUP``) where the command does not say, noted."""
    for key, (value, why) in REFERENCE_SETUP.items():
        if key not in imported.values:
            imported.values[key] = value
            imported.notes.append(f"{key}: {value} ({why}; no --base to take it from)")


def defaults() -> dict[str, Any]:
    """Every field's default (None for a required one)."""
    out: dict[str, Any] = {}
    for model in GROUPS.values():
        for name, f in model.model_fields.items():
            out[name] = None if f.is_required() else f.get_default(call_default_factory=True)
    return out


def render(imported: Imported, base: str | None, source: str) -> str:
    """The recipe YAML: a header naming the source, ``extends`` (with a base), the values, the refused flags as comments."""
    lines = [f"# Imported from a reference command ({source}) by `miles recipe import`.",
             "# Only values that differ from " + (f"the base recipe {base}" if base else "miles' defaults") + " are set."]
    if imported.model_spec:
        lines.append(f"# Model arguments: the named spec {imported.model_spec}. miles reads the model from hf_checkpoint's "
                     f"config.json (check it: miles model-args {imported.model_spec} --config <hf_checkpoint dir>).")
    for note in imported.notes:
        lines.append(f"# note: {note}")
    if base:
        lines.append(f"extends: {base}")
    for key, value in imported.written.items():
        lines.append(f"{key}: {json.dumps(value)}" if isinstance(value, (list, dict)) else
                     yaml.safe_dump({key: value}, sort_keys=False, width=1000).rstrip())
    if imported.refused:
        lines.append("# Refused (not honoured by miles; written because of --allow-refused):")
        lines += [f"# {r.given}  -- {r.reason}" for r in imported.refused]
    return "\n".join(lines) + "\n"

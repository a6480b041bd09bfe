"""Tensor dumps in the layout of SGLang's dumper (sglang.srt.debug_utils.dumper, pinned 0.5.23), so its tools
(dump_loader, the comparator) read what the trainer and miles' engines dump.

One file per dumped value: ``<dir>/<exp_name>/<tags>.pt`` where ``<tags>`` is ``key=value`` joined by ``___``:
step, rank, dump_index, name, recompute_status, the call's own tags, then the context tags (``layer_id``);
the file holds ``{"value": tensor, "meta": {those tags, world_rank, world_size, <framework>_parallel_info, ...}}``.

    Dumper(config)              SGLang's ``_Dumper`` for one process: configure / reset / step / dump / dump_model
    DumperOptions               the DumperConfig fields this dumper implements (the rest: UNSUPPORTED_KEYS, refused)
    parse_pairs(pairs, field)   key=value pairs -> {key: value}, keys and types from the wheel's DumperConfig
                                (the snapshot: rollout/sglang/protocol.json "dumper"), as DumperConfig._kv_pairs_to_dict
    Dumper.hook(model)          the non-intrusive hooks (``register_non_intrusive_dumper``): each module's inputs and
                                output; mode "core" dumps only the core fields (input_ids, position_ids, ...), "all"
                                every tensor as ``non_intrusive__<module>.<inputs.i|inputs.<kw>|output>``, "off" none;
                                a ``layers.<i>`` module sets the ``layer_id`` tag for what runs inside it

What differs from SGLang's, on purpose: no HTTP control server or ZMQ broadcast (our engine server serves
``/dumper/{method}`` itself: rollout/http/server.py), no collectives (each rank names its files by its own rank),
no grafter; the keys of those parts are refused at load (UNSUPPORTED_KEYS). Console lines go to the logger.
"""

from __future__ import annotations

import logging
import random
import re
import shutil
import sys
import time
from dataclasses import dataclass, fields, replace
from functools import cache, wraps
from pathlib import Path
from typing import Any, Callable

import torch

logger = logging.getLogger(__name__)

# DumperConfig keys of SGLang's dumper that this one does not implement, and why (refused at load, naming the key)
UNSUPPORTED_KEYS = {
    "server_port": "miles' dumper has no HTTP control server of its own (miles configures it per rollout)",
    "collective_timeout": "miles' dumper runs no collectives (each rank names its files by its own rank)",
    "source_patcher_config": "set dumper_source_patcher_config_train / _inference instead",
    **dict.fromkeys([f"grafter_{k}" for k in ("enable", "role", "b2t_filter", "t2b_filter", "master_address", "master_port",
                                               "baseline_world_size", "target_world_size", "backend", "group_name",
                                               "timeout", "transform_path")],
                    "SGLang's grafter (tensor transplant between two running systems) is not part of miles' dumper"),
}
NON_INTRUSIVE_MODES = ("off", "core", "all")
LAYER_NAME = re.compile(r"(?:.+\.)?layers\.(\d+)$")  # SGLang's _NonIntrusiveDumper._LAYER_NAME_RE
DEFAULT_EXP_PREFIX = "dump_"


@cache
def facts() -> dict[str, Any]:
    """The pinned wheel's dumper, as the snapshot records it (tools/sglang_protocol.py dumper_facts)."""
    from miles_core.rollout.sglang.protocol import protocol

    return protocol()["dumper"]


def parse_pairs(pairs: list[str] | None, field: str) -> dict[str, Any]:
    """``["enable=true", "filter=layer_id < 3"]`` -> {"enable": True, "filter": "layer_id < 3"}: a bool key is true for
    true / 1 (any case), an int key int(value), others the string; an empty value the key's default (DumperConfig)."""
    config = facts()["config"]
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ValueError(f"{field}: {pair!r} is not key=value (e.g. {field}: ['enable=true', 'non_intrusive_mode=all'])")
        if key not in config:
            raise ValueError(f"{field}: unknown dumper key {key!r}; SGLang's DumperConfig has {', '.join(sorted(config))}")
        default = config[key]["default"]
        if not raw.strip():
            out[key] = default
        elif isinstance(default, bool):
            out[key] = raw.lower() in ("true", "1")
        elif isinstance(default, int):
            try:
                out[key] = int(raw)
            except ValueError:
                raise ValueError(f"{field}: dumper key {key} takes an int, got {raw!r}") from None
        else:
            out[key] = raw
    return out


@dataclass(frozen=True)
class DumperOptions:
    """The DumperConfig fields miles' dumper implements, with SGLang's defaults."""

    enable: bool = False
    filter: str | None = None
    dir: str = "/tmp/dumper"
    enable_output_file: bool = True
    enable_output_console: bool = True
    enable_value: bool = True
    enable_grad: bool = False
    enable_model_value: bool = False
    enable_model_grad: bool = False
    exp_name: str | None = None
    cleanup_previous: bool = False
    non_intrusive_mode: str = "core"
    include_parallel_rank_in_filename: bool = False

    def __post_init__(self) -> None:
        if self.non_intrusive_mode not in NON_INTRUSIVE_MODES:
            raise ValueError(f"dumper non_intrusive_mode {self.non_intrusive_mode!r}: expected one of {NON_INTRUSIVE_MODES}")


def check_keys(values: dict[str, Any], field: str) -> None:
    """Keys this dumper does not implement are refused, naming the field and the key."""
    for key in values:
        if key in UNSUPPORTED_KEYS:
            raise ValueError(f"{field}: dumper key {key} is not supported yet ({UNSUPPORTED_KEYS[key]}); drop it")
    missing = set(values) - {f.name for f in fields(DumperOptions)} - set(UNSUPPORTED_KEYS)
    if missing:  # a DumperConfig field of a newer snapshot that this module does not know yet
        raise ValueError(f"{field}: dumper key {', '.join(sorted(missing))} is not supported yet by miles' dumper; drop it")


class _NoneDict(dict):
    """Unknown tags read as None in a filter expression (``layer_id is None``), as SGLang's _DefaultNoneDict."""

    def __missing__(self, key: str):
        return None


def passes_filter(expr: str | None, tags: dict[str, Any]) -> bool:
    """SGLang's filter: a Python expression over the tags, with ``search`` / ``match`` (re) and no builtins."""
    if expr is None:
        return True
    namespace = _NoneDict(tags)
    namespace.update(search=re.search, match=re.match)
    return bool(eval(expr, {"__builtins__": {}}, namespace))  # noqa: S307 (the user's own debug expression, as SGLang's)


def _recompute_status() -> str:
    """Megatron activation recompute (SGLang's _MegatronPlugin.detect_recompute_status): disabled, original, recompute."""
    random_mod = sys.modules.get("megatron.core.tensor_parallel.random")
    is_checkpointing = getattr(random_mod, "is_checkpointing", None)
    if is_checkpointing is None or not is_checkpointing():
        return "disabled"
    return "recompute" if torch.is_grad_enabled() else "original"


def _recompute_meta(status: str) -> dict[str, int]:
    return {} if status == "disabled" else {"recompute_pseudo_rank": int(status == "recompute"), "recompute_pseudo_size": 2}


def _compact(value):
    """A view is saved as its own tensor, not with the storage it views (SGLang's _clone_if_view); a DTensor (an FSDP2
    parameter or gradient) as this rank's shard."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        value = value.to_local() if hasattr(value, "to_local") else value
        if value.untyped_storage().nbytes() > value.nelement() * value.element_size():
            return value.clone()
    return value


class Dumper:
    """One process's dumper (SGLang's ``_Dumper``): ``rank`` names its files, ``parallel_info`` ({framework: {tp_rank,
    ...}}) goes into every file's meta as ``<framework>_parallel_info`` (and with include_parallel_rank_in_filename
    the pp/tp/cp/ep/etp ranks into the name)."""

    def __init__(self, options: DumperOptions | None = None, rank: int = 0, world_size: int = 1,
                 parallel_info: dict[str, dict] | None = None):
        self.options = options or DumperOptions()
        self.rank = rank
        self.static_meta: dict[str, Any] = {"world_rank": rank, "world_size": world_size}
        self.static_meta |= {f"{k}_parallel_info": v for k, v in (parallel_info or {}).items()}
        self._parallel = {k: v for info in (parallel_info or {}).values() for k, v in info.items()}
        self._hooks: list = []
        self._reset_state()

    def _reset_state(self) -> None:
        self.step_index, self.dump_index, self.ctx = 0, 0, {}
        self._cleaned = False

    # ---- control (SGLang's configure / reset / get_state) -----------------------------------------------
    def configure(self, **values) -> None:
        self.options = replace(self.options, **values)

    def reset(self) -> None:
        """Remove the hooks, restart step and dump_index at 0 (the options stay)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        self._reset_state()

    def state(self) -> dict[str, Any]:
        return {"config": dict(self.options.__dict__), "dump_index": self.dump_index, "step": self.step_index}

    def step(self) -> None:
        """The end of one forward pass (engines) or micro-batch (trainer): later dumps carry the next step."""
        if self.options.enable:
            self._exp_name()
            self.step_index += 1

    def set_ctx(self, **values) -> None:
        self.ctx = {k: v for k, v in (self.ctx | values).items() if v is not None}

    # ---- dumping ------------------------------------------------------------------------------------------
    def dump(self, name: str, value, save: bool = True, dims: str | None = None, dims_grad: str | None = None, **tags) -> None:
        """``value`` (a tensor, or a callable returning one) under ``name``; with enable_grad also its gradient, when
        the backward reaches it (``grad__<name>``, at the step it was dumped in). ``save`` False: nothing written."""
        if not save:
            return
        value_meta = {"dims": dims} if dims is not None else {}
        grad_meta = dict(value_meta)
        if dims_grad is not None:
            value_meta["dims_grad"], grad_meta["dims"] = dims_grad, dims_grad
        o = self.options
        self._dump(name, value, tags, value_on=o.enable_value, grad_now=False, grad_later=o.enable_grad,
                   kinds=("Dumper.Value", "Dumper.Grad"), metas=(value_meta, grad_meta))

    def dump_model(self, model: torch.nn.Module, get_grad: Callable | None = None, name_prefix: str = "param") -> None:
        """Every parameter as ``<prefix>__<name>`` (enable_model_value) and its gradient as ``grad__<prefix>__<name>``
        (enable_model_grad; ``get_grad(param)`` or ``param.grad``)."""
        o = self.options
        for param_name, param in model.named_parameters():
            self._dump(f"{name_prefix}__{param_name}", param, {}, value_on=o.enable_model_value, grad_now=o.enable_model_grad,
                       grad_later=False, kinds=("Dumper.ParamValue", "Dumper.ParamGrad"), metas=({}, {}), get_grad=get_grad)

    def _dump(self, name: str, value, extra: dict, *, value_on: bool, grad_now: bool, grad_later: bool,
              kinds: tuple[str, str], metas: tuple[dict, dict], get_grad: Callable | None = None) -> None:
        if not self.options.enable:
            return
        status = _recompute_status()
        tags = {"name": name, "recompute_status": status, **extra, **self.ctx}
        if not passes_filter(self.options.filter, tags) or not (value_on or grad_now or grad_later):
            return
        value = value() if callable(value) else value  # SGLang's _materialize_value
        recompute = _recompute_meta(status)
        if value_on:
            self._write(kinds[0], tags, value, meta={**metas[0], **recompute})
        if grad_now and isinstance(value, torch.Tensor):
            grad = get_grad(value) if get_grad is not None else value.grad
            if grad is not None:
                self._write(kinds[1], {**tags, "name": f"grad__{name}"}, grad, meta={**metas[1], **recompute})
        if grad_later and isinstance(value, torch.Tensor) and value.requires_grad:
            step, grad_tags = self.step_index, {"name": f"grad__{name}", **extra}  # SGLang's: no context tags
            value.register_hook(lambda g: self._write("Dumper.Grad", grad_tags, g, step=step, meta=metas[1]))

    def _write(self, kind: str, tags: dict, value, step: int | None = None, meta: dict | None = None) -> None:
        o = self.options
        exp_name = self._exp_name()
        self.dump_index += 1
        keys = {"step": self.step_index if step is None else step, "rank": self.rank, "dump_index": self.dump_index, **tags}
        if o.include_parallel_rank_in_filename:
            keys |= {k: self._parallel[k] for k in ("pp_rank", "tp_rank", "cp_rank", "ep_rank", "etp_rank") if k in self._parallel}
        path = Path(o.dir) / exp_name / ("___".join(f"{k}={v}" for k, v in keys.items()) + ".pt")
        if o.enable_output_console:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else None
            logger.info("[%s] %s shape=%s dtype=%s", kind, path, shape, getattr(value, "dtype", None))
        if not o.enable_output_file:
            return
        if o.cleanup_previous and not self._cleaned:
            self._cleaned = True
            cleanup_previous(Path(o.dir), exp_name)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"value": _compact(value), "meta": {**keys, **self.static_meta, **(meta or {})}}, path)

    def _exp_name(self) -> str:
        if self.options.exp_name is None:  # SGLang's default: dump_<UTC time>_<ms><random>
            now = time.time()
            name = f"{DEFAULT_EXP_PREFIX}{time.strftime('%Y%m%d_%H%M%S', time.gmtime(now))}_{int(now % 1 * 1000):03d}{random.randint(0, 999):03d}"
            self.configure(exp_name=name)
        return self.options.exp_name

    # ---- the non-intrusive hooks ------------------------------------------------------------------------
    def hook(self, model: torch.nn.Module) -> None:
        """Hooks on every module of ``model`` (removed by reset); nothing with non_intrusive_mode off."""
        mode = self.options.non_intrusive_mode
        if mode == "off":
            return
        core = frozenset(facts()["core_fields"])
        prefix = facts()["non_intrusive_prefix"]

        def dump_value(module_name: str, value, sub_name: str) -> None:
            for key, item in _tensors(value).items():
                effective = key or sub_name.rsplit(".", 1)[-1]
                if effective in core:
                    self.dump(effective, item)
                elif mode == "all":
                    self.dump(prefix + ".".join(p for p in (module_name, sub_name, key) if p), item)

        for module_name, module in model.named_modules():
            if (layer_id := _layer_id(module_name, module)) is not None:
                self._hooks.append(module.register_forward_pre_hook(lambda _m, _a, i=layer_id: self.set_ctx(layer_id=i)))
                self._hooks.append(module.register_forward_hook(lambda _m, _a, _o: self.set_ctx(layer_id=None)))

            def pre(_m, args, kwargs, name=module_name):
                for i, item in enumerate(args):
                    dump_value(name, item, f"inputs.{i}")
                for kw, item in kwargs.items():
                    dump_value(name, item, f"inputs.{kw}")

            def post(_m, _args, output, name=module_name):
                if output is not None:
                    dump_value(name, output, "output")

            if module_name == "":  # the root: its forward replaced, so a direct .forward() call dumps too (SGLang's)
                self._hooks.append(_ReplacedForward(module, pre, post))
            else:
                self._hooks += [module.register_forward_pre_hook(pre, with_kwargs=True), module.register_forward_hook(post)]


def _layer_id(module_name: str, module: torch.nn.Module) -> int | None:
    """A ``layers.<i>`` module's layer id: its ``layer_id`` (SGLang), ``layer_number - 1`` (Megatron), else i."""
    match = LAYER_NAME.fullmatch(module_name)
    if match is None:
        return None
    if hasattr(module, "layer_id"):
        return module.layer_id
    if hasattr(module, "layer_number"):
        return module.layer_number - 1
    return int(match.group(1))


def _tensors(value) -> dict[str, Any]:
    """A module input or output -> {key: tensor}: a tensor {"": t}; a tuple / list its tensors ({"": t} for one, else
    by position); Megatron's PackedSeqParams its cu_seqlens_q / _kv and qkv_format; anything else nothing."""
    if isinstance(value, torch.Tensor):
        return {"": value}
    if isinstance(value, (tuple, list)):
        tensors = [t for t in value if isinstance(t, torch.Tensor)]
        return {"": tensors[0]} if len(tensors) == 1 else {str(i): t for i, t in enumerate(tensors)}
    packed = sys.modules.get("megatron.core.packed_seq_params")
    if packed is not None and isinstance(value, packed.PackedSeqParams):
        return {"cu_seqlens_q": value.cu_seqlens_q, "cu_seqlens_kv": value.cu_seqlens_kv, "qkv_format": value.qkv_format}
    return {}


class _ReplacedForward:
    """The root module's forward wrapped with the dump hooks; ``remove()`` restores it."""

    def __init__(self, module: torch.nn.Module, pre, post):
        self.module, original = module, module.forward

        @wraps(original)
        def forward(*args, **kwargs):
            pre(module, args, kwargs)
            output = original(*args, **kwargs)
            post(module, args, output)
            return output

        self._wrapped, self._original = forward, original
        module.forward = forward

    def remove(self) -> None:
        if self.module.forward is self._wrapped:
            del self.module.forward  # the instance attribute: the class's forward again
            if self.module.forward != self._original:
                self.module.forward = self._original


def cleanup_previous(base: Path, exp_name: str | None) -> None:
    """cleanup_previous: the dir's earlier default-named runs (dump_*) and ``exp_name``'s dir, before the first write."""
    targets = set(base.glob(f"{DEFAULT_EXP_PREFIX}*")) | ({base / exp_name} if exp_name else set())
    for d in sorted(t for t in targets if t.is_dir()):
        shutil.rmtree(d)


def remove_dir(path: Path) -> None:
    """A phase's or an exp's dump dir, removed before it is written again (the reference's _cleanup_dump_dir)."""
    if path.is_dir():
        shutil.rmtree(path)


# ---- the three phases of a run (the reference's miles/utils/dumper_utils.py) ----------------------------------
PHASE_FIELDS = {"inference": "dumper_inference", "fwd_only": "dumper_fwd_only", "fwd_bwd": "dumper_fwd_bwd"}


def phase_values(misc, phase: str) -> dict[str, Any]:
    """{"enable": dumper_enable, **the phase's key=value pairs}: a phase's own enable=... wins."""
    field = PHASE_FIELDS[phase]
    return {"enable": misc.dumper_enable, **parse_pairs(getattr(misc, field), field)}


def phase_options(cfg, phase: str, exp_name: str, **fixed) -> DumperOptions | None:
    """The options of one phase's dumps under cfg.dumper_root / exp_name, or None when the phase is off. As the
    reference's DumperMegatronUtil._configure: dir and exp_name first, console off, then the user's pairs."""
    values = phase_values(cfg.misc, phase)
    if not values["enable"]:
        return None
    return DumperOptions(**{"dir": str(cfg.dumper_root), "exp_name": exp_name, "enable_output_console": False,
                            **fixed, **values})


def check_config(cfg) -> None:
    """At load: every phase's pairs parse against the wheel's DumperConfig; what miles' dumper does not implement is
    refused naming the field and key (the inference pairs of rollout_engine sglang go to SGLang's own dumper); a
    phase's pairs or the inference source patcher with that phase off are refused rather than ignored."""
    m = cfg.misc
    sglang = cfg.cluster.rollout_engine == "sglang"
    if phase_values(m, "inference")["enable"] and cfg.rollout.async_mode == "fully":
        raise ValueError("dumper_inference (dumper_enable) with async_mode fully is not supported yet: its engines generate "
                         "between rollouts, so no rollout's dumps could be told apart (the reference refuses it too); use "
                         "another async_mode, or turn the inference phase off (dumper_inference: ['enable=false'])")
    for phase, field in PHASE_FIELDS.items():
        values = phase_values(m, phase)
        if set(values) - {"enable"} and not values["enable"]:  # options of a phase that never runs
            raise ValueError(f"{field} sets {', '.join(sorted(set(values) - {'enable'}))} but its phase is off: add enable=true "
                             f"to it, or set dumper_enable (or drop {field})")
        if not (phase == "inference" and sglang):
            check_keys(values, field)
            DumperOptions(**values)
    if m.dumper_source_patcher_config_inference is not None:
        if not sglang:
            raise ValueError(f"dumper_source_patcher_config_inference is not supported yet with rollout_engine "
                             f"{cfg.cluster.rollout_engine}: miles' own engines apply no source patches yet (the HF "
                             "engine shares the trainer's process and code, so a patched function would dump from both; "
                             "SGLang servers apply it themselves; the trainer's code: dumper_source_patcher_config_train); "
                             "use rollout_engine sglang, or drop it")
        if not phase_values(m, "inference")["enable"]:
            raise ValueError("dumper_source_patcher_config_inference applies only with the inference phase on: set "
                             "dumper_enable (or dumper_inference enable=true), or drop it")


def sglang_env(cfg) -> dict[str, str]:
    """The DUMPER_* environment of every SGLang server (the reference's dumper_utils.get_sglang_env): the control route
    on the server's own port (DUMPER_SERVER_PORT=reuse), the hook mode (registered when the model loads, so it must be
    there before the configure call) and the source patcher's YAML; {} with the inference phase off."""
    values = phase_values(cfg.misc, "inference")
    if not values["enable"]:
        return {}
    env = {"DUMPER_SERVER_PORT": "reuse"}  # DumperConfig.from_env's names: DUMPER_ + the field (tests/rollout/test_dumper.py)
    if mode := values.get("non_intrusive_mode"):
        env["DUMPER_NON_INTRUSIVE_MODE"] = str(mode)
    patcher = cfg.misc.dumper_source_patcher_config_inference or values.get("source_patcher_config")
    if patcher:
        env["DUMPER_SOURCE_PATCHER_CONFIG"] = str(patcher)
    return env


def configure_engines(cfg, engine) -> None:
    """Before a rollout's generation (the reference's configure_sglang): <dumper_root>/engines wiped, then engine i
    configured at /dumper/configure with {enable, dir: dumper_root, exp_name: engines/engine_<i>, the phase's pairs}
    (``engine.configure_dumper(body_of)``: the HF engine is engine 0, the router's slot i engine i); nothing with the
    inference phase off."""
    values = phase_values(cfg.misc, "inference")
    if not values["enable"]:
        return
    remove_dir(cfg.dumper_root / "engines")
    engine.configure_dumper(lambda i: {"enable": True, "dir": str(cfg.dumper_root), "exp_name": f"engines/engine_{i}",
                                       **values})

"""LoRA adapters served by the HF engine, unmerged: SGLang's ``/load_lora_adapter`` (a PEFT dir on disk),
``/load_lora_adapter_from_tensors`` and ``/unload_lora_adapter`` with one adapter slot (the reference's
``max_loras_per_batch 1``), and ``lora_path`` per generate request (a request naming the adapter runs base + adapter,
one without it the base).

    load(model, name, config_dict, tensors,   PEFT's LoRA layers injected into the model on the first load
         expected_checksums=None)             (``config_dict``: the adapter_config.json, as SGLang takes it), then the
                                              tensors copied in; every adapter tensor must be given, names as in
                                              adapter_model.safetensors (``base_model.model.<module>.lora_{A,B}.weight``);
                                              with ``expected_checksums`` ({name: sha256 hex}, SGLang's field of
                                              LoadLoRAAdapterFromTensorsReqInput, the reference's check_lora_weight_equal)
                                              the received tensors must hash to them, name for name, before any is copied
    unload(name)                              the name stops serving (its layers stay, a load of the same name refills them)
    serving(model, name)                      a context: the adapter layers on (``name``) or off (None) for a forward
    read_adapter_dir(path)                    a PEFT dir (adapter_config.json + adapter_model.safetensors) -> (config, tensors)

SGLang's rules kept: a name already loaded is refused (unload it first), a request naming an adapter not loaded
is refused. A targeted layer computes ``x W^T + (lora_alpha / r) * x A^T B^T``, the trainer's PEFT forward, so the
engine's log-probs are the trainer's (tests/rollout/test_adapters.py).
"""

from __future__ import annotations

import dataclasses
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable

import torch

from miles_core.weights.disk import ADAPTER_CONFIG, ADAPTER_WEIGHTS  # a PEFT adapter dir's files

PEFT_PREFIX = "base_model.model."  # adapter_model.safetensors' key prefix (PeftModel.save_pretrained)


class AdapterError(ValueError):
    """An adapter call SGLang refuses too (the server answers 400)."""


class ServedAdapters:
    """The engine's adapter slot: at most one adapter's layers in the model; ``loaded``: names served now."""

    def __init__(self):
        self.injected: str | None = None  # the adapter name PEFT's layers carry
        self.config: dict | None = None
        self.loaded: set[str] = set()

    def load(self, model: torch.nn.Module, name: str, config_dict: dict, tensors: Iterable[tuple[str, torch.Tensor]],
             expected_checksums: dict[str, str] | None = None) -> None:
        tensors = list(tensors)
        if expected_checksums is not None:
            check_checksums(name, tensors, expected_checksums)
        if name in self.loaded:
            raise AdapterError(f"LoRA adapter {name!r} is already loaded; unload it first (/unload_lora_adapter)")
        if self.injected is None:
            self._inject(model, name, config_dict)
        elif name != self.injected or _shape_keys(config_dict) != _shape_keys(self.config):
            raise AdapterError(f"this engine serves one LoRA adapter ({self.injected!r}, rank {self.config.get('r')}); "
                               f"{name!r} with rank {config_dict.get('r')} does not fit its slot")
        params = model.state_dict(keep_vars=True)
        ours = {n for n in params if f".lora_A.{name}." in n or f".lora_B.{name}." in n}
        given = {_engine_name(k, name): t for k, t in tensors}
        if set(given) != ours:
            missing, extra = sorted(ours - set(given)), sorted(set(given) - ours)
            raise AdapterError(f"LoRA adapter {name!r}: {len(missing)} adapter tensors missing {missing[:3]}, "
                               f"{len(extra)} not adapter tensors of this model {extra[:3]}")
        with torch.no_grad():
            for n, t in given.items():
                if tuple(t.shape) != tuple(params[n].shape):
                    raise AdapterError(f"LoRA adapter {name!r}: {n} has shape {tuple(t.shape)}, the engine's {tuple(params[n].shape)}")
            for n, t in given.items():
                params[n].copy_(t)
        self.loaded.add(name)

    def unload(self, name: str) -> None:
        if name not in self.loaded:
            raise AdapterError(f"LoRA adapter {name!r} is not loaded (loaded: {sorted(self.loaded)})")
        self.loaded.discard(name)

    @contextmanager
    def serving(self, model: torch.nn.Module, name: str | None):
        if name is not None and name not in self.loaded:
            raise AdapterError(f"lora_path {name!r}: no such LoRA adapter loaded (loaded: {sorted(self.loaded)})")
        if self.injected is None:
            yield
            return
        from peft.tuners.tuners_utils import BaseTunerLayer

        layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
        for m in layers:
            m.enable_adapters(name is not None)
        try:
            yield
        finally:
            for m in layers:
                m.enable_adapters(False)

    def _inject(self, model: torch.nn.Module, name: str, config_dict: dict) -> None:
        from peft import LoraConfig, inject_adapter_in_model

        if config_dict.get("peft_type", "LORA") != "LORA":
            raise AdapterError(f"LoRA adapter {name!r}: peft_type {config_dict.get('peft_type')!r}, this engine serves LORA only")
        known = {f.name for f in dataclasses.fields(LoraConfig)}
        config = LoraConfig(**{k: v for k, v in config_dict.items() if k in known and k not in ("peft_type", "task_type")})
        with torch.random.fork_rng(devices=[]):  # PEFT's init draws A; the caller's RNG stream stays as it was
            inject_adapter_in_model(config, model, adapter_name=name)
        from peft.tuners.tuners_utils import BaseTunerLayer

        for m in model.modules():
            if isinstance(m, BaseTunerLayer):
                m.enable_adapters(False)  # on only inside serving(name)
        model.eval()  # the injected dropout modules too
        self.injected, self.config = name, dict(config_dict)


def check_checksums(name: str, tensors: list[tuple[str, torch.Tensor]], expected: dict[str, str]) -> None:
    """The received adapter must be the sent one: the same names (none missing, none extra), each hashing to its digest."""
    from miles_core.weights.disk import tensor_sha256

    got = {n: tensor_sha256(t) for n, t in tensors}  # what arrived, hashed here
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    wrong = sorted(n for n in set(got) & set(expected) if got[n] != expected[n])
    if missing or extra or wrong:
        raise AdapterError(f"LoRA adapter {name!r} failed its checksum check (check_lora_weight_equal): {len(wrong)} tensors "
                           f"differ from the sender's {wrong[:3]}, {len(missing)} missing {missing[:3]}, {len(extra)} extra "
                           f"{extra[:3]}")


def read_adapter_dir(path: str | Path) -> tuple[dict, list[tuple[str, torch.Tensor]]]:
    """A PEFT adapter dir, as SGLang's /load_lora_adapter takes ``lora_path`` -> (adapter_config.json, the tensors of
    adapter_model.safetensors). A local directory only (SGLang also takes a hub id, which no engine here downloads)."""
    from safetensors.torch import load_file

    p = Path(path)
    if not p.is_dir():
        raise AdapterError(f"lora_path {str(path)!r}: no such directory (a PEFT adapter dir with {ADAPTER_CONFIG} and "
                           f"{ADAPTER_WEIGHTS}, on this engine's file system)")
    missing = [f for f in (ADAPTER_CONFIG, ADAPTER_WEIGHTS) if not (p / f).is_file()]
    if missing:
        raise AdapterError(f"lora_path {str(path)!r}: not a PEFT adapter dir, {' and '.join(missing)} missing")
    try:
        config = json.loads((p / ADAPTER_CONFIG).read_text())
        tensors = load_file(str(p / ADAPTER_WEIGHTS))
    except Exception as e:  # a truncated file: json's or safetensors' own error, named
        raise AdapterError(f"lora_path {str(path)!r}: unreadable adapter ({type(e).__name__}: {e})") from e
    if not isinstance(config, dict):
        raise AdapterError(f"lora_path {str(path)!r}: {ADAPTER_CONFIG} is not a JSON object")
    return config, sorted(tensors.items())


def _engine_name(key: str, name: str) -> str:
    """``base_model.model.<module>.lora_A.weight`` -> the model's ``<module>.lora_A.<name>.weight``."""
    module = key.removeprefix(PEFT_PREFIX)
    for ab in ("lora_A", "lora_B"):
        if f".{ab}." in module:
            head, leaf = module.split(f".{ab}.", 1)
            return f"{head}.{ab}.{name}.{leaf}"
    return module


def _shape_keys(config: dict | None) -> tuple:
    c = config or {}
    targets = c.get("target_modules")
    return c.get("r"), c.get("lora_alpha"), tuple(sorted(targets)) if isinstance(targets, (list, tuple, set)) else targets


class ThroughAdapter:
    """An engine (or router) whose every generate request runs through adapter ``lora_name`` (lora_sync_from_tensor: the
    reference's lora_path on each request, miles/rollout/sglang_rollout.py); every other member is the engine's."""

    def __init__(self, engine, lora_name: str):
        self._engine, self.lora_name = engine, lora_name

    def generate_seeded(self, requests, seeds):
        return self._engine.generate_seeded([dataclasses.replace(r, lora_path=self.lora_name) for r in requests], seeds)

    def generate(self, requests, seed: int):
        return self._engine.generate([dataclasses.replace(r, lora_path=self.lora_name) for r in requests], seed)

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

"""LoRA in the torch trainer: the engine's adapter strategy, given at construction (torch_trainer.TorchEngine).

``NoAdapters`` (lora_rank 0) does nothing. ``LoraAdapters`` injects PEFT LoRA layers into the policy in place
(``peft.inject_adapter_in_model``: the model stays a transformers causal LM, so the packed forward, FSDP units
and ``config`` are unchanged), freezes every base weight and trains the adapters only. For a targeted linear
layer with base weight W [out, in], adapters A [r, in] and B [out, r] (B starts at zero, so the first forward
is the base model's) and scaling s = lora_alpha / lora_rank:

    y = x W^T + s * dropout(x) A^T B^T              (PEFT's LoraLayer, lora_type "lora")
    merged weight W' = W + s * B A                  (what the engines and the merged export get)

Names: the policy's state dict holds ``<module>.base_layer.weight`` and ``<module>.lora_{A,B}.default.weight``;
``merged_state`` gives the base model's own names (``<module>.weight``) with W', so weight sync and the merged
export look like a full fine-tune's. The PEFT adapter format (adapter_config.json + adapter_model.safetensors,
keys ``base_model.model.<module>.lora_A.weight``) is peft's own (get/set_peft_model_state_dict), so
``peft.PeftModel.from_pretrained(base, dir)`` loads an export and ``lora_adapter_path`` reads PEFT's.

A checkpoint holds the adapter tensors and their optimizer state, not the frozen base (re-read from
hf_checkpoint), plus ``base_sha256`` of the base tensors: a resume over a different base is refused.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable

import torch

from miles_core.config.lora import LoraConfig as LoraFields

BASE_SUFFIX = ".base_layer."
ADAPTER = "default"  # PEFT's adapter name
PEFT_PREFIX = "base_model.model."  # what PeftModel.save_pretrained puts before the module names
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


class LoraError(ValueError):
    """An adapter that does not fit this run (lora_adapter_path, or a checkpoint's base)."""


class NoAdapters:
    """lora_rank 0: every parameter trained, weights as they are."""

    enabled = False

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def merged_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return state

    def engine_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return state


class LoraAdapters:
    """PEFT LoRA adapters on the policy (module docstring); ``base_model_name``: written into adapter_config.json."""

    enabled = True

    def __init__(self, lora: LoraFields, base_model_name: str | None = None):
        self.lora, self.base_model_name = lora, base_model_name
        self.scaling = lora.lora_alpha / lora.lora_rank
        self.base_sha256: str | None = None

    def peft_config(self):
        from peft import LoraConfig

        f = lo = self.lora
        return LoraConfig(r=f.lora_rank, lora_alpha=f.lora_alpha, lora_dropout=lo.lora_dropout, bias="none",
                          target_modules=f.targets if isinstance(f.targets, str) else list(f.targets),
                          exclude_modules=list(f.excluded) or None, base_model_name_or_path=self.base_model_name,
                          task_type="CAUSAL_LM")

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        """Adapters injected in place (seeded by torch's RNG, as PEFT does), base frozen; lora_adapter_path loaded."""
        from peft import inject_adapter_in_model

        self.base_sha256 = base_checksum(model.state_dict().items())
        model = inject_adapter_in_model(self.peft_config(), model, adapter_name=ADAPTER)
        for name, p in model.named_parameters():
            p.requires_grad_(is_adapter(name))
        if not any(p.requires_grad for p in model.parameters()):
            raise LoraError(f"target_modules ({self.lora.target_modules}) matched no linear layer of the model")
        if self.lora.lora_adapter_path:
            self.load_adapter(model, Path(self.lora.lora_adapter_path))
        return model

    # ---- names and merged weights ---------------------------------------------------------------------------
    def merged_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The base model's names and W + s * B A for every adapted layer (fp32 math, the base's dtype); no adapter keys."""
        out: dict[str, torch.Tensor] = {}
        for name, t in state.items():
            if is_adapter(name):
                continue
            if BASE_SUFFIX not in name:
                out[name] = t
                continue
            module, leaf = name.split(BASE_SUFFIX)
            if leaf == "weight":
                A = state[f"{module}.lora_A.{ADAPTER}.weight"].float()  # [r, in]
                B = state[f"{module}.lora_B.{ADAPTER}.weight"].float()  # [out, r]
                t = (t.float() + self.scaling * (B @ A)).to(t.dtype)  # [out, in]
            out[f"{module}.{leaf}"] = t
        return out

    def base_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The frozen base under the base model's names (W of every adapted layer as loaded); no adapter keys."""
        return {n.replace(BASE_SUFFIX, "."): t for n, t in state.items() if not is_adapter(n)}

    def engine_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What a weight sync sends: the merged weights, or with lora_train_only the frozen base (the reference's
        rollout on the base policy: miles/utils/lora.py lora_rollout_enabled)."""
        return self.base_state(state) if self.lora.lora_train_only else self.merged_state(state)

    def adapter_payload(self, model: torch.nn.Module, state: dict[str, torch.Tensor], dtype: torch.dtype):
        """(adapter_config.json as a dict, [(adapter_model.safetensors name, tensor in ``dtype``)]) of ``state``."""
        from peft import get_peft_model_state_dict

        peft_state = get_peft_model_state_dict(model, state_dict=state, adapter_name=ADAPTER, save_embedding_layers=False)
        config = json.loads(json.dumps(self.peft_config().to_dict(), default=sorted))  # sets -> lists, as the JSON file
        return config, [(PEFT_PREFIX + k, v.detach().to(dtype)) for k, v in peft_state.items()]

    def adapter_state(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The trained tensors by the policy's own names (checkpoints)."""
        return {n: t for n, t in model.state_dict().items() if is_adapter(n)}

    # ---- PEFT adapter directories ---------------------------------------------------------------------------
    def save_adapter(self, model: torch.nn.Module, out: Path, dtype: torch.dtype | None = None,
                     state: dict[str, torch.Tensor] | None = None) -> None:
        """adapter_config.json + adapter_model.safetensors as PeftModel.save_pretrained writes them; ``state``: the
        policy's full state dict (FSDP2 gathers it), default the model's own."""
        from peft import get_peft_model_state_dict

        peft_state = get_peft_model_state_dict(model, state_dict=state, adapter_name=ADAPTER, save_embedding_layers=False)
        self.write_adapter(peft_state, out, dtype)

    def write_adapter(self, state: dict[str, torch.Tensor], out: Path, dtype: torch.dtype | None = None) -> None:
        """A PEFT adapter dir of ``state`` (``<module>.lora_{A,B}.weight``, the whole tensors) and this config."""
        from safetensors.torch import save_file

        out.mkdir(parents=True, exist_ok=True)
        tensors = {PEFT_PREFIX + k: (v.to(dtype) if dtype is not None else v).detach().cpu().contiguous() for k, v in state.items()}
        save_file(tensors, out / ADAPTER_WEIGHTS, metadata={"format": "pt"})
        self.peft_config().save_pretrained(out)

    def read_adapter(self, path: Path) -> dict[str, torch.Tensor]:
        """A PEFT adapter dir's tensors (``<module>.lora_{A,B}.weight``); its rank and alpha must be this config's."""
        from safetensors.torch import load_file

        cfg_file, weights = path / ADAPTER_CONFIG, path / ADAPTER_WEIGHTS
        if not cfg_file.is_file() or not weights.is_file():
            raise LoraError(f"lora_adapter_path {path}: not a PEFT adapter dir (needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
        saved = json.loads(cfg_file.read_text())
        f = self.lora
        for key, ours in (("r", f.lora_rank), ("lora_alpha", f.lora_alpha)):
            if saved.get(key) != ours:
                raise LoraError(f"lora_adapter_path {path}: its {key} is {saved.get(key)!r}, this config's {ours!r} "
                                f"(lora_rank / lora_alpha); set them to the adapter's")
        return {k.removeprefix(PEFT_PREFIX): v for k, v in load_file(weights).items()}

    def load_adapter(self, model: torch.nn.Module, path: Path) -> None:
        """A PEFT adapter dir into the injected adapters; its rank, alpha and modules must be this config's."""
        from peft import set_peft_model_state_dict

        state = self.read_adapter(path)
        before = self.adapter_state(model)
        result = set_peft_model_state_dict(model, state, adapter_name=ADAPTER)
        loaded = {n for n in before if n not in {k for k in getattr(result, "missing_keys", []) if is_adapter(k)}}
        if len(loaded) != len(before) or len(state) != len(before):
            raise LoraError(f"lora_adapter_path {path}: {len(state)} adapter tensors for {len(before)} here; its "
                            f"target_modules ({json.loads((path / ADAPTER_CONFIG).read_text()).get('target_modules')}) must be "
                            f"this config's ({self.lora.target_modules})")

    def check_base(self, saved: str | None, where: Path) -> None:
        """Refuse a checkpoint whose adapters were trained over another base."""
        if saved is None:
            raise LoraError(f"{where}: a checkpoint without LoRA adapters (lora_base_sha256 missing), resumed with lora_rank "
                            f"{self.lora.lora_rank}; resume with the config it was saved with")
        if saved != self.base_sha256:
            raise LoraError(f"{where}: its LoRA adapters were trained over a different base model (lora_base_sha256 "
                            f"{saved[:12]}..., hf_checkpoint now {self.base_sha256[:12]}...); resume over the same hf_checkpoint")


class AdapterView:
    """What the checkpoint code reads and loads with LoRA: the adapter tensors only (``state_dict``), loaded back
    strictly into the policy's adapters (``load_state_dict``); ``config`` the policy's. ``module``: the policy as the
    checkpoint code reads it (the model itself, or data_parallel.FullModule's full tensors under FSDP2)."""

    def __init__(self, module):
        self.module, self.config = module, getattr(module, "config", None)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: t for n, t in self.module.state_dict().items() if is_adapter(n)}

    def load_state_dict(self, state: dict[str, torch.Tensor], strict: bool = True):
        ours = set(self.state_dict())
        if strict and set(state) != ours:
            raise RuntimeError(f"adapter tensors differ: missing {sorted(ours - set(state))[:3]}, unexpected "
                               f"{sorted(set(state) - ours)[:3]}")
        return self.module.load_state_dict(state, strict=False)


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def base_checksum(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over the base tensors' names, dtypes, shapes and bytes (sorted by name)."""
    h = hashlib.sha256()
    for name, t in sorted(named, key=lambda kv: kv[0]):
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def adapters_of(lora: LoraFields, base_model_name: str | None = None) -> NoAdapters | LoraAdapters:
    """The strategy for the config: LoraAdapters with lora_rank > 0, else NoAdapters."""
    return LoraAdapters(lora, base_model_name) if lora.enabled else NoAdapters()

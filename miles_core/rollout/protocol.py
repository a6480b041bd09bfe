"""The engine protocol: requests are token ids, results are token ids + per-token log-probs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Protocol

if TYPE_CHECKING:  # annotations only: a config validates without importing torch
    import torch


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    skip_special_tokens: bool = True  # the response text only (SGLang's default): the token ids never change
    min_new_tokens: int = 0  # SGLang's: EOS and stop_token_ids are masked until this many tokens are generated


@dataclass(frozen=True)
class GenerateRequest:
    input_ids: list[int]
    params: SamplingParams
    lora_path: str | None = None  # SGLang's: the loaded LoRA adapter this request runs through (None: the base model)


@dataclass
class GenerateResult:
    output_ids: list[int]
    output_log_probs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    weight_version: int
    prompt_tokens: int = 0
    completion_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.completion_tokens = len(self.output_ids)


class RolloutEngine(Protocol):
    def generate(self, requests: list[GenerateRequest], seed: int) -> list[GenerateResult]: ...
    def begin_weight_update(self) -> None: ...  # SGLang's session: tensor updates only between begin and end
    def update_weights_from_tensor(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...
    def end_weight_update(self) -> None: ...
    def set_weight_version(self, version: int) -> None: ...
    def get_weight_version(self) -> int: ...
    def health(self) -> bool: ...
    def pause_generation(self) -> None: ...
    def continue_generation(self) -> None: ...
    def flush_cache(self) -> None: ...
    def check_weights(self, action: str, skip_list: list[str] | None = None, allow_quant_error: bool = False,
                      selector: str = "all") -> object: ...  # SGLang's /weights_checker: snapshot | reset_tensors | compare
    def weight_checksums(self) -> list[dict[str, str]]: ...  # /weights_checker checksum: {name: sha256 hex} per engine


class AdapterEngine(Protocol):
    """An engine that serves LoRA adapters unmerged (lora_sync_from_tensor): SGLang's routes of the same names."""

    def load_lora_adapter_from_tensors(self, lora_name: str, config_dict: dict,
                                       named_tensors: Iterable[tuple[str, torch.Tensor]],
                                       expected_checksums: dict[str, str] | None = None) -> None: ...
    def load_lora_adapter(self, lora_name: str, lora_path: str) -> None: ...  # a PEFT adapter dir on the engine's disk
    def unload_lora_adapter(self, lora_name: str) -> None: ...
    def reload_lora_adapter(self, lora_name: str, config_dict: dict, named_tensors: Iterable[tuple[str, torch.Tensor]],
                            expected_checksums: dict[str, str] | None = None) -> None: ...  # unload where loaded, load

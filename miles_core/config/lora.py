"""LoRA adapters (the reference's group ``lora``): with ``lora_rank`` > 0 the trainer trains PEFT LoRA adapters over a
frozen base (torch: miles_core/training/lora.py; Megatron: miles_core/training/megatron/lora.py; docs/guide/lora.md).

One adapter, merged into the engines' weights at every sync; or sent alone to engines that serve it unmerged
(``lora_sync_from_tensor``: as tensors, or by disk as a PEFT dir; ``check_lora_weight_equal`` in misc.py checks it); or never (``lora_train_only``: the engines stay on the base). With colocated engines that
release their weights for each train stage, ``lora_base_cpu_backup`` keeps the base in host memory across the release
(SGLang's enable_weights_cpu_backup), so an adapter sync finds it there. The multi-LoRA flags are refused by
config/reference_flags.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from ._base import Group

# The reference's Megatron names of the decoder's linear layers -> the HF (PEFT) module names they cover.
MEGATRON_MODULES: dict[str, tuple[str, ...]] = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"), "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"), "linear_fc2": ("down_proj",),
}
ALL_LINEAR = "all-linear"


def module_names(value: str | list[str] | None) -> tuple[str, ...]:
    """A target/exclude value (``"q_proj,v_proj"``, a list, or None) -> its names, Megatron names mapped to HF ones."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for item in (s.strip() for s in items):
        for name in MEGATRON_MODULES.get(item, (item,)):
            if name and name not in out:
                out.append(name)
    return tuple(out)


class LoraConfig(Group):
    """LoRA adapters: rank 0 (the default) trains the full model."""

    form_first = ("lora_rank", "lora_alpha", "target_modules")

    lora_rank: int = Field(0, ge=0, description="LoRA rank r; 0 = off (full fine-tuning). With r > 0 the trainer (torch or megatron) "
                           "trains LoRA adapters (PEFT's) over the frozen base and the engines get the merged weights (docs/guide/lora.md).")
    lora_alpha: int = Field(16, ge=1, description="LoRA alpha: the adapter's update is (lora_alpha / lora_rank) * B A.")
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA path (0.0 for RL: with dropout the "
                                "trainer's forward differs from the engines', so the old-policy pass is recomputed).")
    lora_type: Literal["lora", "canonical_lora"] = Field(
        "lora", description="How adapters meet Megatron's fused layers (train_backend megatron): lora, one adapter per fused "
        "layer (linear_qkv's q/k/v and linear_fc1's gate/up share one A, Megatron-Bridge's LoRA); canonical_lora, one adapter "
        "per HF module (Megatron-Bridge's CanonicalLoRA). The torch trainer's HF modules are not fused: both are PEFT's "
        "adapter per module there.")
    target_modules: str | list[str] | None = Field(
        None, description="Linear layers that get adapters (needed with lora_rank > 0): all-linear (every linear layer but the "
        "LM head), or module names, comma-separated or a list: HF names (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,"
        "down_proj) or the reference's Megatron names (linear_qkv, linear_proj, linear_fc1, linear_fc2).")
    exclude_modules: str | list[str] | None = Field(None, description="Module names taken out of target_modules (same forms).")
    lora_adapter_path: str | None = Field(None, description="Start from this PEFT adapter directory (adapter_config.json, "
                                          "adapter_model.safetensors; e.g. a miles export's adapter/), trained further; its "
                                          "rank, alpha and modules must be this config's.")
    lora_sync_from_tensor: bool = Field(False, description="Sync the adapter alone to engines that serve it unmerged, every "
                                        "request through it (SGLang's lora_path), instead of the merged weights: its tensors "
                                        "(SGLang's /load_lora_adapter_from_tensors; our server only), or with "
                                        "update_weight_mode disk a PEFT dir the engines read (SGLang's /load_lora_adapter; "
                                        "what rollout_engine sglang needs). Torch trainer; colocated only with "
                                        "lora_base_cpu_backup (docs/guide/lora.md).")
    lora_train_only: bool = Field(False, description="Train the adapters but keep the engines on the frozen base: every sync sends "
                                  "the base weights, never the adapters (the reference's: rollouts sample the base policy). "
                                  "Torch trainer.")
    lora_base_cpu_backup: bool = Field(False, description="Colocated engines keep a host-memory copy of the base weights "
                                       "when offload_rollout releases them for a train stage (SGLang's "
                                       "--enable-weights-cpu-backup; our server's the same flag), so lora_sync_from_tensor's "
                                       "adapter-only syncs work colocated: the reference's. Needs colocate, "
                                       "lora_sync_from_tensor and offload_rollout_level with weight.")

    @field_validator("target_modules", "exclude_modules")
    @classmethod
    def _names(cls, v):
        if v is not None and not module_names(v):
            raise ValueError("expected all-linear or module names (comma-separated or a list), got no name")
        return v

    @property
    def enabled(self) -> bool:
        return self.lora_rank > 0

    @property
    def targets(self) -> str | tuple[str, ...]:
        """target_modules for PEFT: "all-linear" or HF module names."""
        names = module_names(self.target_modules)
        return ALL_LINEAR if ALL_LINEAR in names else names

    @property
    def excluded(self) -> tuple[str, ...]:
        return module_names(self.exclude_modules)

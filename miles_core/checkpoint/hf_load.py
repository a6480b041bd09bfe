"""Every HF weight load goes through here: the files are checked against config.json before a weight is read.

    check_hf_weights(dir)      safetensors headers (+ index) vs the state dict config.json implies; raises
                               `CheckpointError` listing every missing, unexpected, mis-shaped, non-float and
                               truncated tensor, each with the config.json fields its shape comes from
    load_hf_model(dir, dtype)  check_hf_weights, then `from_pretrained` with its load report checked: a tensor
                               transformers would have initialised fresh or dropped is an error, never a weight
    load_hf_state(dir)         the loaded model's state dict (fp32, HF model names; tied lm_head dropped)

The expected tensors come from the model built on the meta device from config.json (no memory, no weights,
seconds for any size). A checkpoint may hold them in two forms, both accepted: the hub form (what
`save_pretrained` writes and the hub holds: per-expert `experts.{e}.gate_proj.weight`, ...) or the model's own
state-dict form (transformers 5's fused `experts.gate_up_proj`). `pytorch_model.bin` checkpoints have no
header to read: they are checked by the load report alone.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import CheckpointError
from .validate import CONFIG_FILE, read_safetensors_header

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# safetensors dtype -> bytes per element; the float types a weight may have (anything else is refused)
FLOAT_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}
_LAYER = re.compile(r"^(.*?layers\.)(\d+)\.")
# tensor-name fragment -> the config.json fields its shape comes from; first match wins (most specific first)
SHAPE_FIELDS: tuple[tuple[str, str], ...] = (
    ("embed_tokens", "vocab_size, hidden_size"),
    ("lm_head", "vocab_size, hidden_size, tie_word_embeddings"),
    ("shared_expert", "hidden_size, moe_intermediate_size, n_shared_experts / shared_expert_intermediate_size"),
    ("experts", "hidden_size, num_experts / n_routed_experts, moe_intermediate_size"),
    ("mlp.gate.", "hidden_size, num_experts / n_routed_experts"),
    ("q_norm", "head_dim, use_qk_norm"),
    ("k_norm", "head_dim, use_qk_norm"),
    ("q_proj", "hidden_size, num_attention_heads, head_dim, attention_bias"),
    ("k_proj", "hidden_size, num_key_value_heads, head_dim, attention_bias"),
    ("v_proj", "hidden_size, num_key_value_heads, head_dim, attention_bias"),
    ("o_proj", "hidden_size, num_attention_heads, head_dim"),
    ("_proj", "hidden_size, intermediate_size"),
    ("norm", "hidden_size"),
)


@dataclass(frozen=True)
class Expected:
    """The tensors config.json implies: name -> shape, in the hub form and in the model's state-dict form."""

    hub: dict[str, tuple[int, ...]]
    model: dict[str, tuple[int, ...]]
    num_layers: int
    tied: dict[str, tuple[int, ...]]  # tied copies (lm_head.weight): a checkpoint may store them or not


def shape_fields(name: str) -> str:
    """The config.json fields a tensor's shape comes from (SHAPE_FIELDS), e.g. 'hidden_size, intermediate_size'."""
    return next((fields for fragment, fields in SHAPE_FIELDS if fragment in name), "hidden_size")


def _meta_model(config):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def hub_state_dict(model, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state_dict` (the model's names) as `save_pretrained` stores it: tied weights once, transformers' load-time
    conversions (fused experts) reverted to the hub's per-tensor names."""
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    return revert_weight_conversion(model, remove_tied_weights_from_state_dict(state_dict, model))


def to_hub_form(config_file: Path, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tensors under the HF model's names (fused experts) -> the hub's (per-expert ``experts.{e}.gate_proj.weight``,
    ...), by the conversions transformers itself reverts on save (the model built on the meta device)."""
    from transformers import AutoConfig

    model = _meta_model(AutoConfig.from_pretrained(Path(config_file).parent if Path(config_file).is_file() else config_file))
    return {k: v.contiguous() for k, v in hub_state_dict(model, dict(state)).items()}


def expected_tensors(path: Path) -> Expected:
    """What `path/config.json` implies, from the model built on the meta device."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
    except (ValueError, KeyError, OSError) as e:
        raise CheckpointError(f"{path / CONFIG_FILE}: transformers cannot build a config from it ({e})") from e
    model = _meta_model(config)
    state = dict(model.state_dict())
    hub = {k: tuple(v.shape) for k, v in hub_state_dict(model, dict(state)).items()}
    tied = set(state) - set(remove_tied(model, state))
    own = {k: tuple(v.shape) for k, v in state.items() if k not in tied}
    layers = getattr(config.get_text_config(), "num_hidden_layers", 0)
    return Expected(hub=hub, model=own, num_layers=layers, tied={k: tuple(state[k].shape) for k in tied})


def remove_tied(model, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    return remove_tied_weights_from_state_dict(dict(state), model)


@dataclass(frozen=True)
class StoredTensor:
    file: str
    dtype: str
    shape: tuple[int, ...]


def stored_tensors(path: Path) -> dict[str, StoredTensor] | None:
    """Every tensor in the safetensors files (headers only), checked for truncation; None for .bin checkpoints."""
    if (path / SINGLE_FILE).is_file():
        files = [SINGLE_FILE]
    elif (path / INDEX_FILE).is_file():
        files = _index_files(path)
    elif any((path / n).is_file() for n in ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        return None
    else:
        raise CheckpointError(f"{path}: no weights (expected {SINGLE_FILE}, {INDEX_FILE} or pytorch_model.bin)")
    out: dict[str, StoredTensor] = {}
    for name in files:
        out |= _file_tensors(path / name)
    return out


def _index_files(path: Path) -> list[str]:
    try:
        weight_map = json.loads((path / INDEX_FILE).read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path / INDEX_FILE}: unreadable or no 'weight_map' ({e!r})") from e
    missing = sorted({f for f in weight_map.values() if not (path / f).is_file()})
    if missing:
        raise CheckpointError(f"{path / INDEX_FILE}: names shard file(s) that are missing: {missing}")
    return sorted(set(weight_map.values()))


def _file_tensors(file: Path) -> dict[str, StoredTensor]:
    header = read_safetensors_header(file)
    with open(file, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
    end = max((info["data_offsets"][1] for info in header.values()), default=0)
    size = file.stat().st_size
    if size < 8 + header_len + end:
        raise CheckpointError(f"{file}: truncated ({size} bytes, its header describes {8 + header_len + end})")
    return {name: StoredTensor(file.name, info["dtype"], tuple(info["shape"])) for name, info in header.items()}


def weight_problems(stored: dict[str, StoredTensor], expected: Expected) -> list[str]:
    """Every difference between the stored tensors and what config.json implies, one line each."""
    stored = {n: s for n, s in stored.items() if expected.tied.get(n) != s.shape}
    want = expected.model if set(stored) == set(expected.model) else expected.hub
    problems = [f"{n} ({s.file}): dtype {s.dtype} is not a float type" for n, s in sorted(stored.items())
                if s.dtype not in FLOAT_DTYPES]
    problems += _layer_count_problems(stored, want, expected.num_layers)
    for name in sorted(set(want) - set(stored)):
        if not _beyond(name, stored, expected.num_layers):
            problems.append(f"{name}: missing (config.json {shape_fields(name)} imply it, shape {list(want[name])})")
    for name in sorted(set(stored) - set(want)):
        if not _beyond(name, want, expected.num_layers):
            problems.append(f"{name} ({stored[name].file}): unexpected, config.json describes no such tensor")
    for name in sorted(set(stored) & set(want)):
        if stored[name].shape != want[name]:
            problems.append(f"{name} ({stored[name].file}): shape {list(stored[name].shape)}, config.json "
                            f"({shape_fields(name)}) implies {list(want[name])}")
    return problems


def _layer(name: str) -> int | None:
    m = _LAYER.match(name)
    return int(m.group(2)) if m else None


def _beyond(name: str, other: dict, num_layers: int) -> bool:
    """A tensor of a layer the other side has none of (reported once per layer, as a layer count)."""
    i = _layer(name)
    return i is not None and (i >= num_layers or not any(_layer(k) == i for k in other))


def _layer_count_problems(stored: dict, want: dict, num_layers: int) -> list[str]:
    have = {i for i in map(_layer, stored) if i is not None}
    implied = {i for i in map(_layer, want) if i is not None}
    out = [f"layers {sorted(have - implied)}: in the files, but config.json num_hidden_layers={num_layers} implies "
           f"layers 0..{num_layers - 1}"] if have - implied else []
    if implied - have:
        out.append(f"layers {sorted(implied - have)}: missing from the files (config.json num_hidden_layers={num_layers}); "
                   f"the files hold layers {_span(have)}")
    return out


def _span(layers: set[int]) -> str:
    if not layers:
        return "none"
    return f"0..{max(layers)}" if layers == set(range(max(layers) + 1)) else str(sorted(layers))


def check_hf_weights(path: Path) -> dict[str, StoredTensor] | None:
    """Refuse (CheckpointError naming every problem) an HF dir whose weights do not fit its config.json."""
    path = Path(path)
    if not (path / CONFIG_FILE).is_file():
        raise CheckpointError(f"{path / CONFIG_FILE}: missing")
    stored = stored_tensors(path)
    if stored is None:
        return None
    problems = weight_problems(stored, expected_tensors(path))
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        raise CheckpointError(f"{path}: the weights do not fit config.json ({len(problems)} problem(s)):\n  " + "\n  ".join(shown))
    return stored


def load_hf_model(path: Path, dtype: torch.dtype | str = torch.float32):
    """`AutoModelForCausalLM.from_pretrained(path, dtype)` after check_hf_weights; any tensor transformers reports
    missing, unexpected or mis-shaped (it would have been initialised fresh, dropped or resized) is an error."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    check_hf_weights(path)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    model, info = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, output_loading_info=True)
    report = {k: sorted(map(str, info.get(k) or ())) for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")}
    if any(report.values()):
        lines = [f"{k}: {v[:10]}" for k, v in report.items() if v]
        raise CheckpointError(f"{path}: transformers' load report is not clean (no weight may be invented or dropped): "
                              + "; ".join(lines))
    return model


def load_hf_state(path: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors (fp32) under the HF model's state-dict names; a tied lm_head is not listed."""
    model = load_hf_model(path, torch.float32)
    return remove_tied(model, model.state_dict())

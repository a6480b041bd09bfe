"""The reference's debug dumps of rollout data (miles/ray/rollout/debug_data.py), in its file format.

    save_rollout     save_debug_rollout_data: ``template.format(rollout_id=i)`` <- torch.save({rollout_id, metadata,
                     samples: [Sample.to_dict()]}) (the reference's payload; its optional parquet mirror for its
                     dashboard is not written), and save_debug_trajectory_data: one JSONL row per sample that
                     recorded a conversation (metadata["messages"], moved out of the .pt as there)
    load_rollout     load_debug_rollout_data (+ _subsample: the first and last halves of int(n * ratio) samples);
                     also ci_inject_rollout_data_path's recordings
    check_injection  ci_inject_rollout_data_*: the generated batch pairs with the recording (same count, same prompt
                     tokens per sample) and its responses match the recording's tokens at a mean ratio above the bound

Files are read with ``torch.load(weights_only=True)``: plain data only (a reference dump holding other pickled
objects, e.g. numpy arrays of routed experts, is refused naming the file). Sample fields the reference has and
miles does not (spec_info, prefix_cache_info, multimodal_*, ...) are dropped when they hold their empty default;
a set one fails naming it.
"""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path

import torch

from miles_core.data import Sample

log = logging.getLogger(__name__)
SAMPLE_FIELDS = frozenset(Sample.__dataclass_fields__)
# the reference's Sample fields without a counterpart here, and the values they hold when unused
EMPTY_REFERENCE_FIELDS = {"rm_type": None, "custom_rm_path": None, "multimodal_inputs": None, "multimodal_train_inputs": None,
                          "rollout_routed_experts": None, "rollout_indexer_topk": None, "remove_sample": False,
                          "opd_reverse_kl": None, "generate_function_path": None, "train_metadata": None, "adapter": None,
                          "reward_spec": None, "routing_key": None, "spec_info": None, "prefix_cache_info": None,
                          "non_generation_time": None, "session_id": None}


def dump_path(template: str, rollout_id: int | str) -> Path:
    return Path(template.format(rollout_id=rollout_id))


def trajectory_rows(samples: list[Sample]) -> list[dict]:
    """One row per sample that recorded a conversation (metadata["messages"])."""
    return [{"sample_index": s.index, "group_index": s.group_index, "status": s.status.value,
             "reward": s.reward if isinstance(s.reward, (int, float)) else None, "prompt": s.prompt,
             "messages": s.metadata["messages"]} for s in samples if s.metadata and s.metadata.get("messages") is not None]


def save_rollout(template: str, samples: list[Sample], rollout_id: int, trajectory_template: str | None = None) -> Path:
    dicts = [s.to_dict() for s in samples]
    if trajectory_template is not None:
        rows = trajectory_rows(samples)
        if rows:  # no conversations: no file, as the reference
            path = dump_path(trajectory_template, rollout_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows), encoding="utf-8")
            for d in dicts:
                d["metadata"].pop("messages", None)  # the JSONL is their home; the .pt stays lean
    path = dump_path(template, rollout_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"rollout_id": rollout_id, "metadata": {}, "samples": dicts}, path)
    log.info("saved debug rollout data of rollout %d to %s", rollout_id, path)
    return path


def _sample(d: dict, path: Path, i: int) -> Sample:
    d = dict(d)
    for name in set(d) - SAMPLE_FIELDS:
        value = d.pop(name)
        empty = EMPTY_REFERENCE_FIELDS.get(name, ...)
        if value is not None and value != empty and not (isinstance(value, dict) and not any(value.values())):
            raise ValueError(f"{path}: sample {i} sets {name}={value!r:.60}, which miles' samples do not carry; it cannot be "
                             "trained on as recorded")
    if d.get("weight_versions"):
        d["weight_versions"] = [int(v) for v in d["weight_versions"]]  # the reference records them as strings
    for name in ("loss_mask", "rollout_log_probs"):
        if d.get(name) is None:
            d.pop(name, None)
    return Sample.from_dict(d)


def load_rollout(template: str, rollout_id: int, subsample: float | None = None) -> list[Sample]:
    path = dump_path(template, rollout_id)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no recorded rollout data for rollout {rollout_id} (the template's file)")
    try:
        payload = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(f"{path}: holds objects other than plain data ({type(e).__name__}), which are not loaded (they "
                         "would run code); record the rollout with miles' save_debug_rollout_data") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("samples"), list):
        raise ValueError(f"{path}: not a debug rollout dump (a dict with a 'samples' list)")
    samples = [_sample(d, path, i) for i, d in enumerate(payload["samples"])]
    if subsample is not None:
        n = int(len(samples) * subsample)
        samples = samples[: n // 2] + samples[len(samples) - n // 2 :]  # the reference's halves from both ends
    return samples


def _response(s: Sample) -> list[int]:
    return s.tokens[len(s.tokens) - s.response_length :]


def check_injection(generated: list[Sample], injected: list[Sample], rollout_id: int, min_ratio: float) -> float:
    """-> the mean response-token match ratio; fails unless the batches pair and the ratio is above ``min_ratio``."""
    if len(generated) != len(injected):
        raise AssertionError(f"ci_inject_rollout_data: rollout {rollout_id} generated {len(generated)} samples, the recording "
                             f"has {len(injected)}")
    ratios = []
    for i, (g, r) in enumerate(zip(generated, injected)):
        if g.tokens[: g.prompt_length] != r.tokens[: r.prompt_length]:
            raise AssertionError(f"ci_inject_rollout_data: rollout {rollout_id} sample {i}: the prompt tokens differ from the "
                                 "recording's (it does not pair with the generated batch)")
        a, b = _response(g), _response(r)
        ratios.append(sum(x == y for x, y in zip(a, b)) / max(len(a), len(b)) if a or b else 1.0)
    mean = sum(ratios) / len(ratios) if ratios else 1.0
    if not mean > min_ratio:
        raise AssertionError(f"ci_inject_rollout_data: rollout {rollout_id}'s responses match the recording at {mean:.4f}, not "
                             f"above ci_inject_rollout_data_min_match_ratio {min_ratio}: the engine's weights diverged from "
                             "the recorded run's")
    return mean


"""A rollout's training data under the reference's keys, and its ``rollout_data_postprocess_path`` hook.

``rollout_data(samples, rewards, batch, tensors)`` is the dict the reference's Megatron actor holds after its
forward-only passes and advantages (miles/backends/megatron_utils/actor.py ``_get_rollout_data`` then
``compute_advantages_and_returns``), one entry per sample, responses cut to their length: tokens, response_lengths,
rewards, loss_masks, rollout_log_probs, log_probs, ref_log_probs, teacher_log_probs, values, advantages, returns
(None where the run has no such tensor). save_debug_train_data writes it (train_dump.py).

``postprocess(fn, args, ...)`` calls ``fn(args, rollout_data)`` at the reference's point (after the advantages,
before the optimizer steps; on every rank that holds the outputs, with the whole rollout: miles' forward-only
passes gather every row to each rank, so the function must give every rank the same result) and takes back what
it changed, per sample: loss_masks, advantages, returns, log_probs, ref_log_probs, rollout_log_probs,
teacher_log_probs, values (same length as the response). Changing tokens, response_lengths or rewards (already
consumed: the batch is built, the advantages computed; custom_reward_post_process_path reshapes rewards), adding a
key, or setting one the run does not compute is an error naming it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import torch

from miles_core.data.sample import Sample

from .batch import TokenBatch
from .engine import RolloutTensors

# reference key -> (where it lives: "batch" or "tensors", the attribute)
WRITABLE = {"loss_masks": ("batch", "loss_mask"), "rollout_log_probs": ("batch", "rollout_log_probs"),
            "log_probs": ("tensors", "old"), "ref_log_probs": ("tensors", "ref"), "teacher_log_probs": ("tensors", "teacher"),
            "values": ("tensors", "values"), "advantages": ("tensors", "adv"), "returns": ("tensors", "returns")}
CONSUMED = ("tokens", "response_lengths", "rewards")


def _rows(t: torch.Tensor | None, lengths: list[int]) -> list[torch.Tensor] | None:
    return None if t is None else [t[i, :n].detach().cpu().clone() for i, n in enumerate(lengths)]  # [T_i] each


def rollout_data(samples: list[Sample], rewards: list[float], batch: TokenBatch, tensors: RolloutTensors) -> dict:
    lengths = [s.response_length for s in samples]
    data: dict[str, Any] = {"tokens": [list(s.tokens) for s in samples], "response_lengths": lengths, "rewards": list(rewards)}
    for key, (where, attr) in WRITABLE.items():
        source = batch if where == "batch" else tensors
        data[key] = _rows(getattr(source, attr), lengths)
    return data


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    return a == b


def hook(cfg) -> tuple[Callable, Any] | None:
    """(the function, its ``args``: the config under the reference's names) of rollout_data_postprocess_path, or None."""
    path = cfg.rollout.rollout_data_postprocess_path
    if path is None:
        return None
    from miles_core.resolve import reference_args, resolve
    from miles_core.rollout.multi_turn.spec import reference_args as flat_reference_args

    return resolve(path, what="rollout_data_postprocess_path"), reference_args(**flat_reference_args(cfg))


def postprocess(fn: Callable, args, samples: list[Sample], rewards: list[float], batch: TokenBatch,
                tensors: RolloutTensors) -> TokenBatch:
    """-> the batch (a new one if loss_masks or rollout_log_probs changed); ``tensors`` is updated in place."""
    data = rollout_data(samples, rewards, batch, tensors)
    before = rollout_data(samples, rewards, batch, tensors)
    fn(args, data)
    where = "rollout_data_postprocess_path"
    if extra := sorted(set(data) - set(before)):
        raise ValueError(f"{where} added {extra}: miles' trainers read only {sorted(before)}")
    if missing := sorted(set(before) - set(data)):
        raise ValueError(f"{where} removed {missing} from rollout_data")
    for key in CONSUMED:
        if not _same(data[key], before[key]):
            raise ValueError(f"{where} changed {key}, which this trainer has consumed before the hook (the batch is built, "
                             "the advantages computed): change rewards in custom_reward_post_process_path, tokens in a "
                             "custom generate function")
    lengths = before["response_lengths"]
    for key, (place, attr) in WRITABLE.items():
        new, old = data[key], before[key]
        if old is None:
            if new is not None:
                raise ValueError(f"{where} set {key}, which this run does not compute (it is None here)")
            continue
        if not isinstance(new, (list, tuple)) or len(new) != len(lengths):
            raise ValueError(f"{where}: {key} must stay a list of {len(lengths)} per-sample tensors")
        rows = []
        for i, (row, n) in enumerate(zip(new, lengths)):
            row = torch.as_tensor(row)
            if row.shape != (n,):
                raise ValueError(f"{where}: {key}[{i}] has shape {tuple(row.shape)}, sample {i}'s response has {n} tokens")
            rows.append(row)
        if all(_same(r.to(o.dtype), o) for r, o in zip(rows, old)):
            continue
        source = batch if place == "batch" else tensors
        full = getattr(source, attr).clone()  # a new tensor: another field may share the old one (use_rollout_logprobs)
        for i, (row, n) in enumerate(zip(rows, lengths)):
            full[i, :n] = row.to(full.dtype)
        if place == "batch":
            batch = replace(batch, **{attr: full})
        else:
            setattr(tensors, attr, full)
    return batch

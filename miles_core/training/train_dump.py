"""save_debug_train_data: a rollout's training data as the trainer used it, after the optimizer steps (the reference's
miles/utils/train_dump_utils.py: save_debug_train_data_for_rank).

``template.format(rollout_id=i, rank=r)`` <- torch.save({rollout_id, rank, rollout_data}), rollout_data in the
reference's keys, one entry per sample (responses cut to their length): tokens, response_lengths, loss_masks, rewards,
rollout_log_probs, log_probs, ref_log_probs, teacher_log_probs, values, advantages, returns (None when the run has no
such tensor). Every rank that holds the outputs (the last pipeline stage) writes the whole batch: miles' forward-only
passes gather every row to each rank.
"""

from __future__ import annotations

from pathlib import Path

import torch

from miles_core.data.sample import Sample

from .batch import TokenBatch
from .engine import RolloutTensors
from .rollout_data import rollout_data


def save_train_data(template: str, rollout_id: int, samples: list[Sample], rewards: list[float], batch: TokenBatch,
                    tensors: RolloutTensors) -> Path:
    rank = torch.distributed.get_rank() if torch.distributed.is_available() and torch.distributed.is_initialized() else 0
    data = rollout_data(samples, rewards, batch, tensors)
    path = Path(template.format(rollout_id=rollout_id, rank=rank))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"rollout_id": rollout_id, "rank": rank, "rollout_data": data}, path)
    return path

"""OPD teachers (`use_opd`): where the teacher log-probs of the sampled tokens come from.

    opd_type megatron  ModelTeacher: a second causal LM in this process (loaded from
                       `opd_teacher_load`), run forward-only on the trainer's batch.
    opd_type sglang    EngineTeacher: an engine scored with prefill-only requests,
                       engine.score(input_ids_list, temperature) -> per-token log-probs
                       (see miles_core/models/scoring.py, what an in-process engine runs for it).
    neither            the samples carry `teacher_log_probs` (filled during the rollout,
                       e.g. by a custom reward post-process, as the reference system's OPD example).

Every teacher scores with log_softmax(logits / rollout_temperature), like the policy, so the
reverse KL logp_old - logp_teacher compares like with like. Teacher and student must share
the tokenizer: the vocabulary sizes are checked when the teacher is loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

import torch

from .batch import TokenBatch, forward_only, response_log_probs


class Teacher(Protocol):
    def log_probs(self, batch: TokenBatch) -> torch.Tensor:
        """Teacher log-probs [N, T] of the response tokens of `batch`."""
        ...


class ModelTeacher:
    """An in-process teacher model (opd_type megatron)."""

    def __init__(self, model, temperature: float, micro_batch_size: int):
        self.model = model.eval()
        self.temperature = temperature
        self.micro_batch_size = micro_batch_size

    def log_probs(self, batch: TokenBatch) -> torch.Tensor:
        return forward_only(lambda piece: response_log_probs(self.model, piece, self.temperature, False)[0],
                            batch, self.micro_batch_size)


class EngineTeacher:
    """A teacher behind an engine that scores token ids with prefill-only requests (opd_type sglang)."""

    def __init__(self, engine, temperature: float):
        if not callable(getattr(engine, "score", None)):
            raise TypeError(f"opd_type sglang needs an engine with score(input_ids_list, temperature); {type(engine).__name__} has none")
        self.engine = engine
        self.temperature = temperature

    def log_probs(self, batch: TokenBatch) -> torch.Tensor:
        device, batch = batch.loss_mask.device, batch.to("cpu")  # scores arrive as lists: filled on the CPU
        lengths = batch.attention_mask.sum(-1).tolist()  # [N]
        ids = [row[:n].tolist() for row, n in zip(batch.input_ids, lengths)]
        scored = self.engine.score(ids, self.temperature)  # N lists of L_i - 1 log-probs
        out = torch.zeros_like(batch.loss_mask)  # [N, T]
        for i, lps in enumerate(scored):
            if len(lps) != lengths[i] - 1:
                raise ValueError(f"engine.score returned {len(lps)} log-probs for a sequence of {lengths[i]} tokens; expected {lengths[i] - 1}")
            valid = batch.resp_index[i] >= 0
            out[i, valid] = torch.tensor(lps, dtype=out.dtype)[batch.resp_index[i, valid]]
        return out.to(device)


def load_teacher(cfg, dtype: torch.dtype, vocab_size: int, make_engine: Callable | None = None,
                 device: torch.device | None = None) -> Teacher | None:
    """The teacher of `cfg` (None without use_opd, or with opd_type sglang and no opd_teacher_load:
    then the samples must carry teacher_log_probs), on `device` (the trainer's; default cpu). make_engine(model)
    wraps a teacher model in an engine for opd_type sglang (the local runtime's stand-in for an SGLang teacher server)."""
    from miles_core.checkpoint.hf_load import load_hf_model

    from miles_core.env import cache_dir
    from miles_core.models import resolve_model_path

    a = cfg.algo
    if not a.use_opd or a.opd_teacher_load is None:
        return None
    path: Path = resolve_model_path(a.opd_teacher_load, cache_dir())
    model = load_hf_model(path, dtype=dtype).to(device or "cpu").eval()
    if model.config.vocab_size != vocab_size:
        raise ValueError(
            f"opd_teacher_load {a.opd_teacher_load}: teacher vocab_size {model.config.vocab_size} != student vocab_size {vocab_size}; "
            "OPD compares log-probs of the same token ids, so teacher and student must share the tokenizer"
        )
    temperature = cfg.rollout.rollout_temperature
    if a.opd_type == "megatron":
        return ModelTeacher(model, temperature, a.micro_batch_size)
    if make_engine is None:
        raise ValueError("opd_type sglang with opd_teacher_load needs an engine to serve the teacher (make_engine)")
    return EngineTeacher(make_engine(model), temperature)

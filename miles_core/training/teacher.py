"""OPD teachers (`use_opd`): where the teacher log-probs of the sampled tokens come from.

    opd_type megatron  ModelTeacher: a second causal LM in this process (loaded from
                       `opd_teacher_load`), run forward-only on the trainer's batch.
    opd_type sglang    EngineTeacher: an engine scored with prefill-only requests,
                       engine.score(input_ids_list, temperature) -> per-token log-probs
                       (see miles_core/models/scoring.py, what an in-process engine runs for it).
    opd_teacher_urls   HttpTeacher: teachers behind SGLang's POST /generate (SGLang, or miles' own server),
                       each sample posted, prefill-only, to the teacher its metadata[opd_teacher_key] names
                       (the reserved name ``default`` for a sample without one or with an unknown one),
                       as the reference's on_policy_distillation.reward_func.
    neither            the samples carry `teacher_log_probs` (filled during the rollout,
                       e.g. by a custom reward post-process, as the reference system's OPD example).

Top-k OPD (opd_log_prob_top_k > 0, algorithms/opd.py): the trainer's engine gives the old policy's full
distribution of each micro-batch (TrainEngine.opd_topk_reverse_kl) and the teacher returns the top-k estimate
against it: ModelTeacher from its own full distribution, HttpTeacher from the teacher's top_logprobs_num and
token_ids_logprob answers (the student's top-k ids of the sample). The reference reads the student side from the
rollout engine (its output_top_logprobs, and a second scoring request for the teacher's ids); here both come from
the old policy the sampled-token estimate also uses (logp_old).

Every in-process teacher scores with log_softmax(logits / rollout_temperature), like the policy, so the
reverse KL logp_old - logp_teacher compares like with like; SGLang's input log-probs are log_softmax of the raw
logits, so opd_teacher_urls needs rollout_temperature 1 (config rules). Teacher and student must share
the tokenizer: the vocabulary sizes are checked when the teacher is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import torch

from miles_core.config.algo import parse_teacher_urls
from miles_core.algorithms.opd import STUDENT_TOP, TEACHER_ON_STUDENT, TEACHER_TOP, topk_position_kl, topk_reverse_kl

from .batch import TokenBatch, forward_only, response_log_probs, response_logits

DEFAULT_TEACHER = "default"  # the reference's reserved opd_teacher_urls name: the route of samples without a known one


@dataclass(frozen=True)
class TopK:
    """Top-k OPD's settings (opd_log_prob_top_k, opd_top_k_strategy, opd_reward_weight_mode)."""

    k: int
    strategy: str
    mode: str

    @classmethod
    def of(cls, algo) -> "TopK":
        return cls(algo.opd_log_prob_top_k, algo.opd_top_k_strategy, algo.opd_reward_weight_mode)


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

    @torch.no_grad()
    def topk_kl(self, student_logp: torch.Tensor, piece: TokenBatch, samples: list, topk: TopK) -> torch.Tensor:
        """Top-k OPD of one micro-batch: student_logp [n, t, V] (the old policy) -> kl [n, t] (algorithms/opd.py)."""
        teacher_logp = torch.log_softmax(response_logits(self.model, piece).float() / self.temperature, dim=-1)  # [n, t, V]
        return topk_reverse_kl(student_logp, teacher_logp, topk.k, topk.strategy, topk.mode)


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


class HttpTeacher:
    """Teachers behind SGLang's /generate (opd_teacher_urls): one prefill-only request per sample, to the URL of
    the teacher its metadata[opd_teacher_key] names (the reference's _teacher_url_for_sample and _score_payload)."""

    def __init__(self, urls: dict[str, str], key: str, timeout_s: float = 300.0):
        import httpx

        self.urls, self.key = urls, key
        self.client = httpx.Client(timeout=timeout_s)

    @classmethod
    def of(cls, algo) -> "HttpTeacher":
        return cls(parse_teacher_urls(algo.opd_teacher_urls), algo.opd_teacher_key)

    def url_for(self, sample) -> str:
        """The teacher of ``sample``: metadata[key] names it; ``default`` serves a sample without a known name."""
        meta = sample.metadata if isinstance(sample.metadata, dict) else {}
        name = meta.get(self.key)
        if name is not None and str(name) in self.urls:
            return self.urls[str(name)]
        if DEFAULT_TEACHER in self.urls:
            return self.urls[DEFAULT_TEACHER]
        got = f"metadata[{self.key!r}] = {name!r} names no teacher" if name is not None else f"metadata has no {self.key!r}"
        raise ValueError(f"sample {sample.index} (group {sample.group_index}): {got} of opd_teacher_urls "
                         f"(teachers: {sorted(self.urls)}) and there is no {DEFAULT_TEACHER!r} teacher; set "
                         f"metadata[{self.key!r}] (opd_teacher_key) in the data or add a {DEFAULT_TEACHER}=URL entry")

    def score(self, sample, top_k: int = 0, token_ids: list[int] | None = None) -> dict:
        """The meta_info of the teacher's answer to a prefill-only request for ``sample.tokens``."""
        body = {"input_ids": list(sample.tokens), "return_logprob": True, "logprob_start_len": 0,
                "sampling_params": {"temperature": 0, "max_new_tokens": 0, "skip_special_tokens": False}}
        if top_k > 0:
            body["top_logprobs_num"] = top_k
        if token_ids:
            body["token_ids_logprob"] = token_ids
        url = self.url_for(sample)
        resp = self.client.post(url, json=body)
        if resp.status_code != 200:
            raise RuntimeError(f"OPD teacher {url} answered {resp.status_code} for sample {sample.index}: {resp.text[:300]}")
        return resp.json()["meta_info"]

    @staticmethod
    def response_part(meta: dict, field: str, n: int) -> list:
        """meta_info[field] at the n response tokens (the entries after SGLang's placeholder for token 0)."""
        values = meta.get(field)
        if values is None:
            raise ValueError(f"the OPD teacher's answer has no meta_info.{field}")
        part = values[1:][-n:] if n > 0 else []
        if len(part) != n:
            raise ValueError(f"the OPD teacher's meta_info.{field} has {len(part)} response entries, expected {n}")
        return part

    def log_probs(self, batch: TokenBatch, samples: list) -> torch.Tensor:
        """[N, T] the teachers' log-probs of each sample's response tokens (input_token_logprobs)."""
        out = torch.zeros_like(batch.loss_mask, device="cpu")  # [N, T]
        for i, sample in enumerate(samples):
            n = sample.response_length
            entries = self.response_part(self.score(sample), "input_token_logprobs", n)
            out[i, :n] = torch.tensor([float(e[0]) for e in entries])
        return out.to(batch.loss_mask.device)

    def topk_kl(self, student_logp: torch.Tensor, piece: TokenBatch, samples: list, topk: TopK) -> torch.Tensor:
        """Top-k OPD of one micro-batch: student_logp [n, t, V] (the old policy) -> kl [n, t]. The teacher is asked
        for its top-k (strategies reading it) and its log-probs of the sample's student top-k ids (strategies
        reading those: the union over positions, as the reference's token_ids_logprob); the student's log-probs of
        the teacher's ids come from student_logp."""
        out = torch.zeros(student_logp.shape[:2])  # [n, t]
        k = min(topk.k, student_logp.shape[-1])
        student_top = student_logp.topk(k, dim=-1).indices.cpu()  # [n, t, k]
        for i, sample in enumerate(samples):
            n = sample.response_length
            s_ids = student_top[i, :n].tolist()  # n lists of k ids
            asked = sorted({t for row in s_ids for t in row}) if topk.strategy in TEACHER_ON_STUDENT else None
            meta = self.score(sample, topk.k if topk.strategy in TEACHER_TOP else 0, asked)
            teacher_top = (self.response_part(meta, "input_top_logprobs", n) if topk.strategy in TEACHER_TOP
                           else [[] for _ in range(n)])
            on_student = self.response_part(meta, "input_token_ids_logprobs", n) if asked else [[] for _ in range(n)]
            row = student_logp[i].float().cpu()  # [t, V]
            for j in range(n):
                t_map = {int(e[1]): float(e[0]) for e in (on_student[j] or [])}
                t_map |= {int(e[1]): float(e[0]) for e in (teacher_top[j] or [])}
                t_ids = [int(e[1]) for e in (teacher_top[j] or [])]
                mine = s_ids[j] if topk.strategy in STUDENT_TOP else []
                s_map = {t: float(row[j, t]) for t in {*mine, *t_ids}}
                out[i, j] = topk_position_kl(topk.strategy, topk.mode, mine, t_ids, s_map, t_map)
        return out.to(student_logp.device)


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

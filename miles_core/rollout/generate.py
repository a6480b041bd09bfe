"""The generate loop: prompts -> groups of G samples -> rewards -> (dynamic filter) -> a Rollout.

One rollout takes ``rollout_batch_size`` groups. With ``over_sampling_batch_size`` it samples that
many groups per round, drops groups the filter rejects, and stops once enough groups are kept.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

from miles_core.data.sample import Sample, Status
from miles_core.data.source import DataSource
from miles_core.rewards import RewardOptions, batched_async_rm, reward_value
from miles_core.utils import load_function

from .filters import FILTERS
from .protocol import GenerateRequest, SamplingParams

FINISH_STATUS = {"stop": Status.COMPLETED, "length": Status.TRUNCATED, "abort": Status.ABORTED}


@dataclass(frozen=True)
class RolloutSpec:
    """What the loop needs from the config (hashable, built by the runtime)."""

    rollout_batch_size: int
    n_samples_per_prompt: int
    params: SamplingParams
    max_context_len: int | None = None
    over_sampling_batch_size: int | None = None
    filter_path: str | None = None
    reward_key: str | None = None
    seed: int = 0


@dataclass
class Rollout:
    """The batch of scored samples of one rollout id, plus its metrics."""

    rollout_id: int
    samples: list[Sample]
    metrics: dict[str, float] = field(default_factory=dict)


def _requests(prompt_ids: list[int], spec: RolloutSpec) -> GenerateRequest:
    params = spec.params
    if spec.max_context_len is not None:
        room = max(1, spec.max_context_len - len(prompt_ids))
        params = SamplingParams(**{**params.__dict__, "max_new_tokens": min(params.max_new_tokens, room)})
    return GenerateRequest(prompt_ids, params)


def sample_groups(engine, source: DataSource, spec: RolloutSpec, rollout_id: int, n_groups: int, round_idx: int, decode) -> list[list[Sample]]:
    """Draw n_groups prompts, generate G responses each, return unscored groups."""
    pairs = source.next_prompts(n_groups)
    G = spec.n_samples_per_prompt
    reqs = [_requests(p.input_ids, spec) for _, p in pairs for _ in range(G)]
    results = engine.generate(reqs, seed=(spec.seed * 1_000_003 + rollout_id * 1009 + round_idx) % 2**31)
    groups = []
    for gi, (group_index, prompt) in enumerate(pairs):
        group = []
        for k in range(G):
            res = results[gi * G + k]
            group.append(
                Sample(
                    group_index=group_index, index=group_index * G + k, rollout_id=rollout_id, prompt=prompt.text,
                    tokens=list(prompt.input_ids) + res.output_ids, response=decode(res.output_ids),
                    response_length=len(res.output_ids), label=prompt.label, loss_mask=[1] * len(res.output_ids),
                    rollout_log_probs=res.output_log_probs, weight_versions=[res.weight_version],
                    status=FINISH_STATUS[res.finish_reason], metadata=dict(prompt.metadata),
                )
            )
        groups.append(group)
    return groups


def generate_rollout(engine, source: DataSource, spec: RolloutSpec, reward: RewardOptions, rollout_id: int, decode) -> Rollout:
    """Sample, score and filter until rollout_batch_size groups are kept."""
    want = spec.rollout_batch_size
    per_round = spec.over_sampling_batch_size or want
    keep_filter = load_function(spec.filter_path, FILTERS) if spec.filter_path else None
    kept: list[list[Sample]] = []
    drops: Counter[str] = Counter()
    round_idx = 0
    while len(kept) < want:
        groups = sample_groups(engine, source, spec, rollout_id, per_round, round_idx, decode)
        flat = [s for g in groups for s in g]
        for s, r in zip(flat, asyncio.run(batched_async_rm(flat, reward))):
            s.reward = r
        for g in groups:
            if len(kept) >= want:
                break  # the rest of an over-sampled round is aborted, not filtered (REFERENCE §2)
            verdict = keep_filter(g, lambda s: reward_value(s.reward, spec.reward_key)) if keep_filter else None
            if verdict is not None and not verdict.keep:
                drops[verdict.reason or "filtered"] += 1
            else:
                kept.append(g)
        round_idx += 1
        if round_idx > 100 and not kept:
            raise RuntimeError(f"dynamic sampling kept no group in {round_idx} rounds (drops: {dict(drops)})")
    samples = [s for g in kept for s in g]
    metrics = {f"rollout/dynamic_filter/drop_{k}": float(v) for k, v in drops.items()}
    return Rollout(rollout_id, samples, metrics)

"""Rollout metrics of REFERENCE §7, computed from the scored samples of one rollout."""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict

from miles_core.data.sample import Sample, Status


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def rollout_metrics(samples: list[Sample], rewards: list[float], group_size: int) -> dict[str, float]:
    lengths = [s.response_length for s in samples]
    groups: dict[int, list[float]] = defaultdict(list)
    for s, r in zip(samples, rewards):
        groups[s.group_index].append(r)
    m = {
        "rollout/raw_reward": statistics.fmean(rewards),
        "rollout/rewards": statistics.fmean(rewards),
        "rollout/response_len/mean": statistics.fmean(lengths),
        "rollout/response_len/median": float(statistics.median(lengths)),
        "rollout/response_len/max": float(max(lengths)),
        "rollout/response_len/min": float(min(lengths)),
        "rollout/truncated_ratio": sum(s.status == Status.TRUNCATED for s in samples) / len(samples),
        "rollout/weight_version/mean": statistics.fmean(v for s in samples for v in s.weight_versions),
    }
    zero_std = Counter(round(g[0], 1) for g in groups.values() if len(g) > 1 and statistics.pstdev(g) == 0)
    for r, count in zero_std.items():
        m[f"rollout/zero_std/count_{r}"] = float(count)
    k = 1
    while k <= group_size:
        m[f"passrate/pass@{k}"] = statistics.fmean(pass_at_k(len(g), sum(x > 0 for x in g), k) for g in groups.values())
        k *= 2
    return m


def staleness_metrics(samples: list[Sample], trained_version: int) -> dict[str, float]:
    """How many weight syncs old each sample is when trained on (0 unless async_mode is on)."""
    ages = [trained_version - min(s.weight_versions) for s in samples]
    return {"rollout/staleness/mean": statistics.fmean(ages), "rollout/staleness/max": float(max(ages))}

"""Rollout metrics of REFERENCE §7 (names and definitions as the reference system), computed from the scored
samples of one rollout. The runtime calls:

- ``rollout_metrics(samples, rewards, group_size, algo)`` after scoring: rewards (raw and normalised),
  lengths, truncation, repetition, zero-std groups, weight versions, pass@k;
- ``generation_perf_metrics(samples, seconds, num_gpus)`` for the generation throughput;
- ``staleness_metrics(samples, trained_version)`` when training.

Definitions (reference):
- rollout/raw_reward: mean reward before ``custom_reward_post_process_path`` (``metadata["raw_reward"]``
  when the hub post-processed, else the reward); rollout/rewards: mean of the rewards after the estimator's
  group normalisation (~0 for grpo); passrate/pass@k (log_passrate) counts reward == 1 as a pass (raw rewards),
  over complete groups only, k = 1, 2, 4, ... <= group size, only when the group size is > 1.
- rollout/correct_* (log_correct_samples, computed by the trainer's step: it needs logp_old): correct_sample_metrics.
- rollout/zero_std/count_<r>: groups whose rewards are all equal to r (rounded to 1 decimal), a single sample
  included; all_zero / all_one_percentage = count_0.0 / count_1.0 over all groups; not for ppo.
- rollout/weight_version/*: statistics of each sample's oldest weight version; mixed_version_ratio = the
  fraction of samples generated under more than one version.
- rollout/error_cat/<c> (log_reward_category): the fraction of samples whose dict reward has that key equal to c
  (rollouts only: the reference's eval metric names have none).
- rollout/repetition_frac: fraction of responses longer than 10000 characters whose last 10000 compress
  more than 10x (zlib level 9).
- perf/tokens_per_gpu_per_sec = response tokens / seconds / num_gpus; longest_sample_tokens_per_sec = the
  longest response / seconds; the effective_ pair counts only trainable (loss-mask) tokens.
"""

from __future__ import annotations

import math
import statistics
import zlib
from collections import Counter, defaultdict

import torch

from miles_core.algorithms.advantages import normalized_rewards
from miles_core.config.algo import AlgoConfig
from miles_core.data.sample import Sample, Status

REPETITION_WINDOW, REPETITION_RATIO = 10000, 10.0
CORRECT_QUARTERS = ("p25", "p50", "p75", "p100")  # rollout/correct_length/<p>: the quarters of rollout_max_response_len


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_rates(groups: list[list[float]], group_size: int) -> dict[int, float]:
    """pass@k (reward == 1 passes) over the groups with exactly group_size rewards -> {k: value}."""
    complete = [g for g in groups if len(g) == group_size]
    if group_size <= 1 or not complete:
        return {}
    rates, k = {}, 1
    while k <= group_size:
        rates[k] = statistics.fmean(pass_at_k(len(g), sum(x == 1 for x in g), k) for g in complete)
        k *= 2
    return rates


def stats(values: list[float]) -> dict[str, float]:
    """{mean, median, max, min} of a non-empty list."""
    return {"mean": statistics.fmean(values), "median": float(statistics.median(values)),
            "max": float(max(values)), "min": float(min(values))}


def has_repetition(text: str) -> bool:
    """A response longer than the window whose last window compresses more than REPETITION_RATIO times."""
    if len(text) <= REPETITION_WINDOW:
        return False
    tail = text[-REPETITION_WINDOW:].encode("utf-8")
    return len(tail) / max(len(zlib.compress(tail, 9)), 1) > REPETITION_RATIO


def zero_std_counts(groups: list[list[float]]) -> tuple[Counter[str], float, float]:
    """Groups whose rewards are all equal, by the reward rounded to 1 decimal ("1.0"), and the all-0 / all-1
    shares of all groups."""
    counts = Counter(str(round(float(g[0]), 1)) for g in groups if g and all(x == g[0] for x in g))
    total = max(len(groups), 1)
    return counts, counts.get("0.0", 0) / total, counts.get("1.0", 0) / total


def zero_std_metrics(groups: list[list[float]]) -> dict[str, float]:
    """rollout/zero_std/count_<r>, all_zero_percentage, all_one_percentage."""
    counts, all_zero, all_one = zero_std_counts(groups)
    m = {f"rollout/zero_std/count_{r}": float(n) for r, n in counts.items()}
    return m | {"rollout/zero_std/all_zero_percentage": all_zero, "rollout/zero_std/all_one_percentage": all_one}


def oldest_versions(samples: list[Sample]) -> tuple[list[float], float]:
    """Each sample's oldest weight version, and the fraction of samples with more than one version."""
    oldest = [float(min(s.weight_versions)) for s in samples if s.weight_versions]
    return oldest, sum(len(set(s.weight_versions)) > 1 for s in samples) / max(len(samples), 1)


def raw_reward(sample: Sample, reward: float) -> float:
    """The reward before custom_reward_post_process_path (the hub keeps it in metadata["raw_reward"])."""
    return float((sample.metadata or {}).get("raw_reward", reward))


def correct_sample_metrics(samples: list[Sample], rewards: list[float], max_response_len: int,
                           sample_logp_means: list[float] | None) -> dict[str, float]:
    """rollout/correct_* (log_correct_samples) over the samples whose raw reward is 1, as the reference's
    log_utils.log_rollout_data: their mean response length; correct_length/p<q>, the share of them whose length
    falls in each quarter of max_response_len (the first cut point >= the length; lengths above it are not counted);
    correct_entropy, the mean over them of -(each one's masked token mean of logp_old) (``sample_logp_means``: per
    sample; None: not logged). No correct sample: no metrics."""
    correct = [i for i, (s, r) in enumerate(zip(samples, rewards)) if raw_reward(s, r) == 1]
    if not correct:
        return {}
    lengths = [samples[i].response_length for i in correct]
    cuts = [max_response_len * q / 4 for q in (1, 2, 3)] + [max_response_len]
    counts = [0] * 4
    for n in lengths:
        bucket = next((j for j, cut in enumerate(cuts) if n <= cut), None)
        if bucket is not None:
            counts[bucket] += 1
    total = sum(counts) + 1e-9  # the reference's guard: all beyond max_response_len gives shares of 0
    m = {"rollout/correct_response_lengths": statistics.fmean(lengths)}
    m |= {f"rollout/correct_length/{p}": c / total for p, c in zip(CORRECT_QUARTERS, counts)}
    if sample_logp_means is not None:
        m["rollout/correct_entropy"] = -statistics.fmean(sample_logp_means[i] for i in correct)
    return m


def reward_metrics(samples: list[Sample], rewards: list[float], group_size: int, algo: AlgoConfig,
                   passrate: bool = False) -> dict[str, float]:
    """rollout/raw_reward, rollout/rewards (normalised), rollout/zero_std/*, passrate/pass@k (log_passrate)."""
    raw = [raw_reward(s, r) for s, r in zip(samples, rewards)]
    group_index = torch.tensor([s.group_index for s in samples])
    normalized = normalized_rewards(algo, torch.tensor(rewards, dtype=torch.float64), group_index)  # [N]
    groups: dict[int, list[float]] = defaultdict(list)
    for s, r in zip(samples, raw):
        groups[s.group_index].append(r)
    m = {"rollout/raw_reward": statistics.fmean(raw), "rollout/rewards": float(normalized.mean())}
    if algo.advantage_estimator != "ppo":
        m |= zero_std_metrics(list(groups.values()))
    if passrate:
        m |= {f"passrate/pass@{k}": v for k, v in pass_rates(list(groups.values()), group_size).items()}
    return m


def rollout_metrics(samples: list[Sample], rewards: list[float], group_size: int, algo: AlgoConfig,
                    passrate: bool = False) -> dict[str, float]:
    """Every rollout/* and (with ``passrate``, log_passrate) passrate/* metric of one scored rollout. rewards: the
    scalar reward of each sample."""
    lengths = stats([s.response_length for s in samples])
    truncated = statistics.fmean(float(s.status == Status.TRUNCATED) for s in samples)
    oldest, mixed = oldest_versions(samples)
    m = reward_metrics(samples, rewards, group_size, algo, passrate) | {
        "rollout/response_len/mean": lengths["mean"], "rollout/response_len/median": lengths["median"],
        "rollout/response_len/max": lengths["max"], "rollout/response_len/min": lengths["min"],
        "rollout/response_lengths": lengths["mean"],
        "rollout/total_lengths": statistics.fmean(len(s.tokens) for s in samples),
        "rollout/truncated": truncated,
        "rollout/truncated_ratio": truncated,
        "rollout/repetition_frac": statistics.fmean(float(has_repetition(s.response)) for s in samples),
    }
    if oldest:
        versions = stats(oldest)
        m |= {"rollout/weight_version/mean": versions["mean"], "rollout/weight_version/median": versions["median"],
              "rollout/weight_version/max": versions["max"], "rollout/weight_version/min": versions["min"],
              "rollout/weight_version/mixed_version_ratio": mixed}
    return m


def reward_category_metrics(samples: list[Sample], key: str) -> dict[str, float]:
    """rollout/error_cat/<c>: the fraction of samples whose dict reward has reward[key] == c (log_reward_category)."""
    if not all(isinstance(s.reward, dict) and key in s.reward for s in samples):
        bad = next(s for s in samples if not (isinstance(s.reward, dict) and key in s.reward))
        raise ValueError(f"log_reward_category={key!r}: every reward must be a dict with that key (the reward function's "
                         f"category); sample {bad.index} has reward {bad.reward!r}")
    counts = Counter(str(s.reward[key]) for s in samples)
    return {f"rollout/error_cat/{c}": n / len(samples) for c, n in counts.items()}


def trainable_length(sample: Sample) -> int:
    """Response tokens with loss mask 1 (the reference's effective_response_length)."""
    return int(sum(sample.loss_mask))


def generation_perf_metrics(samples: list[Sample], seconds: float, num_gpus: int) -> dict[str, float]:
    """perf/rollout_time and the token throughputs of one generation pass (module docstring)."""
    seconds = max(seconds, 1e-9)
    lengths, effective = [s.response_length for s in samples], [trainable_length(s) for s in samples]
    return {
        "perf/rollout_time": seconds,
        "perf/tokens_per_gpu_per_sec": sum(lengths) / seconds / num_gpus,
        "perf/longest_sample_tokens_per_sec": max(lengths) / seconds,
        "perf/effective_tokens_per_gpu_per_sec": sum(effective) / seconds / num_gpus,
        "perf/longest_effective_sample_tokens_per_sec": max(effective) / seconds,
    }


def staleness_metrics(samples: list[Sample], trained_version: int) -> dict[str, float]:
    """How many weight syncs old each sample is when trained on (0 unless async_mode is on)."""
    ages = [trained_version - min(s.weight_versions) for s in samples]
    return {"rollout/staleness/mean": statistics.fmean(ages), "rollout/staleness/max": float(max(ages))}

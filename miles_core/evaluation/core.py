"""Evaluate one engine on eval datasets: metrics of REFERENCE §5 (without the step) and sample rows.

Names as the reference (docs/decisions.md, 2026-12-01): ``eval/<ds>`` (mean reward),
``eval/<ds>-none_reward_ratio``, ``eval/<ds>-pass@k``, and the per-sample statistics under ``eval/<ds>/``:
``response_len/{mean,median,max,min}``, ``truncated_ratio`` (the reference also logs it as ``eval/<ds>-truncated_ratio``: one name per value here),
``repetition_frac``, ``zero_std/count_<r>``,
``weight_version/{mean,median,max,min,mixed_version_ratio}`` (definitions in miles_core/rollout/metrics.py).

pass@k (log_passrate) is the unbiased estimator 1 - C(n-c, k) / C(n, k) per prompt (n samples, c of them with reward == 1, as
the reference), averaged over prompts, for k = 1, 2, 4, ... <= n; only when n > 1.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

from miles_core.data.dataset import Prompt
from miles_core.data.sample import Sample, Status
from miles_core.rewards import RewardOptions, batched_async_rm, reward_value
from miles_core.rollout.generate import FINISH_STATUS
from miles_core.rollout.metrics import has_repetition, oldest_versions, pass_rates, stats, zero_std_counts
from miles_core.rollout.protocol import GenerateRequest, SamplingParams

ROWS_PER_DATASET = 8


@dataclass(frozen=True)
class EvalDataset:
    """One eval dataset, ready to generate: prompts (tokenized), G samples each, sampling params.
    ``reward`` overrides the reward options ``evaluate`` is given (a per-dataset rm_type)."""

    name: str
    prompts: tuple[Prompt, ...]
    n_samples: int
    params: SamplingParams
    reward: RewardOptions | None = None
    max_context_len: int | None = None  # eval_max_context_len: prompt + response tokens at most
    passrate: bool = False  # log_passrate: also eval/<ds>-pass@k


def request_params(ds: EvalDataset, prompt_length: int) -> SamplingParams:
    """The dataset's params, the response budget capped to what eval_max_context_len leaves (at least 1 token)."""
    if ds.max_context_len is None:
        return ds.params
    room = max(1, ds.max_context_len - prompt_length)
    if room >= ds.params.max_new_tokens:
        return ds.params
    return replace(ds.params, max_new_tokens=room, min_new_tokens=min(room, ds.params.min_new_tokens))


def evaluate(engine, datasets: list[EvalDataset], reward: RewardOptions, reward_key: str | None, seed: int,
             decode, log: Callable[[dict], bool] | None = None) -> tuple[dict[str, float], list[dict]]:
    """-> (metrics without the step, sample rows for a table: the first rows of each dataset). ``log``
    (custom_eval_rollout_log_function_path) gets {dataset: {rewards, truncated, samples}}; its True drops the metrics."""
    metrics: dict[str, float] = {}
    rows: list[dict] = []
    data: dict[str, dict] = {}
    for ds in datasets:
        samples = generate_samples(engine, ds, seed, decode)
        raw = asyncio.run(batched_async_rm(samples, ds.reward or reward))
        for s, r in zip(samples, raw):
            s.reward = r
        scores = [reward_value(r, reward_key) for r in raw]
        data[ds.name] = {"rewards": scores, "truncated": [s.status == Status.TRUNCATED for s in samples], "samples": samples}
        metrics.update(dataset_metrics(ds.name, ds.n_samples, samples, scores, passrate=ds.passrate))
        rows += [
            {"dataset": ds.name, "prompt": str(s.prompt), "response": s.response, "label": str(s.label), "reward": r,
             "status": s.status.value, "weight_version": s.weight_versions[0]}
            for s, r in list(zip(samples, scores))[:ROWS_PER_DATASET]
        ]
    if log is not None and log(data):
        return {}, rows
    return metrics, rows


def generate_samples(engine, ds: EvalDataset, seed: int, decode) -> list[Sample]:
    """G samples per prompt of ``ds``, in prompt order (group i = prompt i)."""
    n = ds.n_samples
    reqs = [GenerateRequest(p.input_ids, request_params(ds, len(p.input_ids))) for p in ds.prompts for _ in range(n)]
    results = engine.generate(reqs, seed=seed)
    samples = []
    for i, res in enumerate(results):
        p = ds.prompts[i // n]
        samples.append(
            Sample(group_index=i // n, index=i, prompt=p.text, tokens=p.input_ids + res.output_ids,
                   response=decode(res.output_ids), response_length=len(res.output_ids), label=p.label,
                   weight_versions=[res.weight_version], status=FINISH_STATUS[res.finish_reason], metadata=dict(p.metadata))
        )
    return samples


def dataset_metrics(name: str, n: int, samples: list[Sample], scores: list[float], passrate: bool = False) -> dict[str, float]:
    """The §5 metrics of one dataset, named as the reference; ``samples`` in groups of ``n`` (one per prompt);
    pass@k only with ``passrate`` (log_passrate, as the reference's log_eval_rollout_data)."""
    key = f"eval/{name}"
    lengths = stats([s.response_length for s in samples])
    truncated = sum(s.status == Status.TRUNCATED for s in samples) / len(samples)
    oldest, mixed = oldest_versions(samples)
    versions = stats(oldest)
    groups = [scores[i : i + n] for i in range(0, len(scores), n)]  # [B][G]
    counts, _, _ = zero_std_counts(groups)
    m = {
        key: statistics.fmean(scores),
        f"{key}-none_reward_ratio": 0.0,  # every eval sample is scored (a failed reward raises)
        f"{key}/truncated_ratio": truncated,
        f"{key}/response_len/mean": lengths["mean"], f"{key}/response_len/median": lengths["median"],
        f"{key}/response_len/max": lengths["max"], f"{key}/response_len/min": lengths["min"],
        f"{key}/repetition_frac": statistics.fmean(float(has_repetition(s.response)) for s in samples),
        f"{key}/weight_version/mean": versions["mean"], f"{key}/weight_version/median": versions["median"],
        f"{key}/weight_version/max": versions["max"], f"{key}/weight_version/min": versions["min"],
        f"{key}/weight_version/mixed_version_ratio": mixed,
    }
    m |= {f"{key}/zero_std/count_{r}": float(c) for r, c in counts.items()}
    if passrate:
        m |= {f"{key}-pass@{k}": v for k, v in pass_rates(groups, n).items()}
    return m


def eval_params(rollout_params: SamplingParams, temperature, top_p, top_k, max_new_tokens, stop=None,
                stop_token_ids=None, min_new_tokens: int = 0) -> SamplingParams:
    """Unset (None) eval sampling fields inherit the rollout values; stop token ids add to the rollout's (EOS stays);
    ``min_new_tokens`` is capped by the answer budget (SGLang refuses min > max)."""
    pick = lambda v, d: d if v is None else v  # noqa: E731
    return replace(
        rollout_params, temperature=pick(temperature, rollout_params.temperature), top_p=pick(top_p, rollout_params.top_p),
        top_k=pick(top_k, rollout_params.top_k), max_new_tokens=pick(max_new_tokens, rollout_params.max_new_tokens),
        stop=tuple(pick(stop, rollout_params.stop)),
        stop_token_ids=tuple(dict.fromkeys(rollout_params.stop_token_ids + tuple(stop_token_ids or ()))),
        min_new_tokens=min(min_new_tokens, pick(max_new_tokens, rollout_params.max_new_tokens)),
    )

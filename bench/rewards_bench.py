"""Throughput of the ``math`` reward: responses per second on a batch of mixed answers.

Usage: ``python bench/rewards_bench.py [--n 1000] [--out bench/results/rewards_math.json]``

The batch mixes exact answers, equivalent forms settled by normalization (fractions vs
decimals, ``\\dfrac``, thousands separators, percent), equivalent forms that need sympy (surds,
expanded polynomials), wrong numbers, wrong expressions (sympy again) and responses without a
box. It is scored with ``score`` in a loop (one thread) and with ``batched_async_rm``
(concurrent: worker threads + the sympy process pool), ``--repeats`` times each; the median
time counts; every run scores a fresh batch (another seed). Sympy worker start-up is timed
separately, before.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from miles_core.data.sample import Sample  # noqa: E402
from miles_core.rewards import RewardOptions, batched_async_rm, score  # noqa: E402
from miles_core.rewards.math_equal import DEFAULT_SYMPY_TIMEOUT_S  # noqa: E402
from miles_core.rewards.sympy_pool import default_pool  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "rewards_math.json"


def _item(kind: str, rng: random.Random) -> tuple[str, str, float]:
    """(response, label, expected reward) of one kind."""
    a, b, k = rng.randint(1, 999), rng.randint(2, 9999), rng.randint(2, 999)
    text = f"Let us compute step by step. We get {a} and {b}, hence "
    if kind == "exact":
        return text + rf"\boxed{{{a * b}}}", str(a * b), 1.0
    if kind == "fraction":
        return text + rf"\boxed{{\dfrac{{{a * 2}}}{{{8}}}}}", f"{a / 4:g}", 1.0
    if kind == "thousands":
        return text + rf"\boxed{{{a * 1000 + b:,}}}", str(a * 1000 + b), 1.0
    if kind == "surd":
        c = k % 20 + 2
        return text + rf"\boxed{{{c}\sqrt{{{b}}}}}", rf"\sqrt{{{c * c * b}}}", 1.0
    if kind == "poly":
        return text + rf"\boxed{{x^2+{2 * k}x+{k * k}}}", rf"(x+{k})^2", 1.0
    if kind == "wrong_number":
        return text + rf"\boxed{{{a * b + 1}}}", str(a * b), 0.0
    if kind == "wrong_expr":
        return text + rf"\boxed{{x^2+{k}x+{k * k}}}", rf"(x+{k})^2", 0.0
    return text + f"the answer is {a}.", str(a), 0.0


MIX = {"exact": 30, "fraction": 10, "thousands": 10, "surd": 8, "poly": 7,
       "wrong_number": 20, "wrong_expr": 10, "no_box": 5}


def make_batch(n: int, seed: int = 0) -> list[tuple[str, str, float]]:
    rng = random.Random(seed)
    kinds = [kind for kind, weight in MIX.items() for _ in range(weight)]
    return [_item(kinds[i % len(kinds)], rng) for i in range(n)]


def bench_score_loop(batch) -> tuple[float, bool]:
    """(seconds, all rewards as expected) for ``score`` in a loop."""
    start = time.perf_counter()
    rewards = [score("math", response, label) for response, label, _ in batch]
    return time.perf_counter() - start, rewards == [e for _, _, e in batch]


def bench_batched(batch) -> tuple[float, bool]:
    """(seconds, all rewards as expected) for one ``batched_async_rm`` call."""
    samples = [Sample(index=i, response=r, label=l) for i, (r, l, _) in enumerate(batch)]
    start = time.perf_counter()
    rewards = asyncio.run(batched_async_rm(samples, RewardOptions(rm_type="math")))
    return time.perf_counter() - start, rewards == [e for _, _, e in batch]


def _figures(runs, n: int) -> dict:
    seconds = sorted(t for t, _ in runs)
    median = statistics.median(seconds)
    return {"seconds_median": round(median, 3), "seconds_all": [round(t, 3) for t in seconds],
            "responses_per_s": round(n / median, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--repeats", type=int, default=3, help="runs per method; the median counts")
    args = parser.parse_args()
    # a fresh batch for every run, so that sympy's caches in the workers do not flatter repeats
    batches = [make_batch(args.n, seed) for seed in range(2 * args.repeats)]

    start = time.perf_counter()
    default_pool().warm()
    startup_s = time.perf_counter() - start
    loop_runs = [bench_score_loop(b) for b in batches[: args.repeats]]
    batched_runs = [bench_batched(b) for b in batches[args.repeats :]]

    result = {
        "benchmark": "rewards_math",
        "machine": {"platform": platform.platform(), "machine": platform.machine(),
                    "processor": platform.processor(), "cpu_count": os.cpu_count()},
        "python": platform.python_version(),
        "sympy": version("sympy"),
        "n_responses": args.n,
        "mix_percent": MIX,
        "sympy_workers": max(1, min(4, os.cpu_count() or 1)),
        "sympy_timeout_s": DEFAULT_SYMPY_TIMEOUT_S,
        "sympy_worker_startup_s": round(startup_s, 3),
        "repeats": args.repeats,
        "score_loop": _figures(loop_runs, args.n),
        "batched_async_rm": _figures(batched_runs, args.n),
        "all_rewards_as_expected": all(ok for _, ok in loop_runs + batched_runs),
        "mean_expected_reward": sum(e for _, _, e in batches[0]) / args.n,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

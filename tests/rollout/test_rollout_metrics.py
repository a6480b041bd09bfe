"""Rollout metrics as the reference defines them: exact values, loop-vs-vectorised for rollout/rewards."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from miles_core.config.algo import AlgoConfig
from miles_core.data.sample import Sample, Status
from miles_core.rollout.metrics import correct_sample_metrics, generation_perf_metrics, has_repetition, rollout_metrics


def _s(group, reward, length=2, status=Status.COMPLETED, versions=(1,), metadata=None, mask=None):
    return Sample(group_index=group, response_length=length, tokens=[0] * (3 + length), status=status, reward=reward,
                  weight_versions=list(versions), metadata=dict(metadata or {}), loss_mask=mask or [1] * length)


def _metrics(samples, group_size=2, algo=None, passrate=True):
    return rollout_metrics(samples, [float(s.reward) for s in samples], group_size, algo or AlgoConfig(), passrate=passrate)


def test_rewards_is_the_mean_after_group_normalisation_and_raw_reward_before_post_processing():
    # group 0: rewards 1, 0 -> mean .5, unbiased std .7071 -> +-.5/(.7071 + 1e-6); group 1: 1, 1 -> 0, 0
    # post-processing doubled group 0's rewards: raw 0.5, 0 are in metadata
    samples = [_s(0, 1.0, metadata={"raw_reward": 0.5}), _s(0, 0.0, metadata={"raw_reward": 0.0}), _s(1, 1.0), _s(1, 1.0)]
    m = _metrics(samples)
    assert m["rollout/raw_reward"] == pytest.approx((0.5 + 0 + 1 + 1) / 4)
    assert m["rollout/rewards"] == pytest.approx(0.0, abs=1e-7)  # centred per group
    assert _metrics(samples, algo=AlgoConfig(disable_rewards_normalization=True))["rollout/rewards"] == pytest.approx(0.75)
    ppo = _metrics(samples, algo=AlgoConfig(advantage_estimator="ppo"))
    assert ppo["rollout/rewards"] == pytest.approx(0.75) and not any("zero_std" in k for k in ppo)


def test_rewards_loop_vs_vectorised():
    rng = random.Random(3)
    samples = [_s(g, float(rng.randint(0, 3))) for g in range(5) for _ in range(4)]
    for algo in (AlgoConfig(), AlgoConfig(disable_grpo_std_normalization=True),
                 AlgoConfig(advantage_estimator="reinforce_plus_plus_baseline", normalize_advantages=True)):
        scale = algo.advantage_estimator == "grpo" and not algo.disable_grpo_std_normalization
        shaped = []
        for g in range(5):
            group = [s.reward for s in samples if s.group_index == g]
            mean, std = statistics.fmean(group), statistics.stdev(group)
            shaped += [(r - mean) / (std + 1e-6) if scale and std > 0 else r - mean for r in group]
        assert _metrics(samples, 4, algo)["rollout/rewards"] == pytest.approx(statistics.fmean(shaped), abs=1e-6)


def test_pass_at_k_counts_reward_one_and_complete_groups():
    # group 0: [1, 0.5] -> c = 1 (0.5 is not a pass); group 1: [0, 0] -> c = 0; group 2 is incomplete: skipped
    samples = [_s(0, 1.0), _s(0, 0.5), _s(1, 0.0), _s(1, 0.0), _s(2, 1.0)]
    m = _metrics(samples)
    assert m["passrate/pass@1"] == pytest.approx(0.25)  # (1/2 + 0) / 2
    assert m["passrate/pass@2"] == pytest.approx(0.5)  # (1 + 0) / 2
    assert "passrate/pass@1" not in _metrics(samples, group_size=1)
    # log_passrate off (the reference's default): no passrate/* at all, the rest unchanged
    off = _metrics(samples, passrate=False)
    assert off == {k: v for k, v in m.items() if not k.startswith("passrate/")}


def test_correct_sample_metrics_exact():
    # raw rewards 1, 0, 1, 1 (sample 3's post-processed reward is 2, its raw 1); max_response_len 8: cut points 2, 4, 6, 8
    samples = [_s(0, 1.0, length=2), _s(0, 0.0, length=5), _s(1, 1.0, length=7), _s(1, 2.0, length=9, metadata={"raw_reward": 1})]
    logp = [-0.5, -9.0, -1.5, -2.0]  # each sample's masked token mean of logp_old
    m = correct_sample_metrics(samples, [1.0, 0.0, 1.0, 2.0], 8, logp)
    assert m["rollout/correct_response_lengths"] == pytest.approx((2 + 7 + 9) / 3)
    # length 2 -> p25 (2 <= 2), 7 -> p100 (7 <= 8), 9 is beyond every cut point: counted nowhere (total 2)
    assert [m[f"rollout/correct_length/p{q}"] for q in (25, 50, 75, 100)] == pytest.approx([0.5, 0, 0, 0.5])
    assert m["rollout/correct_entropy"] == pytest.approx((0.5 + 1.5 + 2.0) / 3)  # -mean over the correct ones
    assert "rollout/correct_entropy" not in correct_sample_metrics(samples, [1.0, 0.0, 1.0, 2.0], 8, None)
    assert correct_sample_metrics(samples[1:2], [0.0], 8, [-1.0]) == {}  # no correct sample: nothing logged


def test_zero_std_and_lengths_and_versions():
    samples = [_s(0, 1.0, length=4), _s(0, 1.0, status=Status.TRUNCATED), _s(1, 0.0, versions=(2, 3)), _s(1, 0.0),
               _s(2, 1.0), _s(2, 0.0, length=6)]
    m = _metrics(samples)
    assert m["rollout/zero_std/count_1.0"] == 1.0 and m["rollout/zero_std/count_0.0"] == 1.0
    assert m["rollout/zero_std/all_zero_percentage"] == pytest.approx(1 / 3)
    assert m["rollout/zero_std/all_one_percentage"] == pytest.approx(1 / 3)
    assert m["rollout/response_len/mean"] == m["rollout/response_lengths"] == pytest.approx(18 / 6)
    assert (m["rollout/response_len/median"], m["rollout/response_len/max"], m["rollout/response_len/min"]) == (2, 6, 2)
    assert m["rollout/total_lengths"] == pytest.approx(18 / 6 + 3)
    assert m["rollout/truncated"] == m["rollout/truncated_ratio"] == pytest.approx(1 / 6)
    # oldest version per sample: 1, 1, 2, 1, 1, 1
    assert m["rollout/weight_version/mean"] == pytest.approx(7 / 6) and m["rollout/weight_version/max"] == 2
    assert m["rollout/weight_version/min"] == 1 and m["rollout/weight_version/median"] == 1
    assert m["rollout/weight_version/mixed_version_ratio"] == pytest.approx(1 / 6)
    assert m["rollout/repetition_frac"] == 0.0


def test_repetition_and_generation_perf():
    assert has_repetition("ab" * 6000) and not has_repetition("ab" * 4000)  # needs > 10000 characters
    rng = random.Random(0)
    text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(12000))  # random letters compress < 10x
    assert not has_repetition(text)
    samples = [_s(0, 1.0, length=4, mask=[1, 0, 0, 1]), _s(0, 0.0, length=6)]
    perf = generation_perf_metrics(samples, seconds=2.0, num_gpus=2)
    assert perf["perf/rollout_time"] == 2.0
    assert perf["perf/tokens_per_gpu_per_sec"] == pytest.approx(10 / 2 / 2)
    assert perf["perf/effective_tokens_per_gpu_per_sec"] == pytest.approx(8 / 2 / 2)
    assert perf["perf/longest_sample_tokens_per_sec"] == pytest.approx(3.0)
    assert perf["perf/longest_effective_sample_tokens_per_sec"] == pytest.approx(3.0)
    assert math.isfinite(generation_perf_metrics(samples, seconds=0.0, num_gpus=1)["perf/tokens_per_gpu_per_sec"])


def test_a_reference_filter_runs_unchanged(monkeypatch):
    from pathlib import Path

    from miles_core.rollout.filters import FilterResult, load_filter

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "fixtures" / "reference"))
    keep_filter = load_filter("reference_style_rm.filter_func", reward_key="score", n_samples_per_prompt=2)
    same = [_s(0, {"score": 1.0}), _s(0, {"score": 1.0})]
    mixed = [_s(1, {"score": 1.0}), _s(1, {"score": 0.0})]
    assert keep_filter(same, None) == FilterResult(False, "ref_zero_std_1.0")
    assert keep_filter(mixed, None) == FilterResult(True, None)
    assert load_filter("check_no_aborted").__name__ == "check_no_aborted"  # our own form is used as is

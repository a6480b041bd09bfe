"""The §5 metrics of one dataset, exact; inline eval of a live engine pinned to its weight version."""

from __future__ import annotations

import pytest

from miles_core.data.sample import Sample, Status
from miles_core.evaluation import dataset_metrics, run_on_engine


def _s(status=Status.COMPLETED, length=3, version=7):
    return Sample(response_length=length, status=status, weight_versions=[version])


def test_dataset_metrics_exact():
    # 2 prompts x G=4: prompt 0 has c=1 pass, prompt 1 has c=3 passes
    samples = [_s(), _s(Status.TRUNCATED, 5), _s(), _s(), _s(length=1), _s(), _s(), _s(Status.TRUNCATED, 5)]
    scores = [1, 0, 0, 0, 1, 1, 1, 0]
    m = dataset_metrics("ds", 4, samples, scores, passrate=True)
    assert m["eval/ds"] == 0.5  # 4 / 8
    assert m["eval/ds/truncated_ratio"] == 0.25 and "eval/ds-truncated_ratio" not in m  # one name per value  # 2 / 8
    assert m["eval/ds-none_reward_ratio"] == 0.0
    assert m["eval/ds/response_len/mean"] == 3.25  # (3+5+3+3+1+3+3+5) / 8 = 26 / 8
    assert (m["eval/ds/response_len/median"], m["eval/ds/response_len/max"], m["eval/ds/response_len/min"]) == (3, 5, 1)
    assert m["eval/ds/weight_version/mean"] == 7 and m["eval/ds/weight_version/mixed_version_ratio"] == 0.0
    assert m["eval/ds/repetition_frac"] == 0.0 and not any("zero_std" in k for k in m)  # no constant group
    # pass@1 = c/n per prompt: (1/4 + 3/4) / 2 = 0.5
    # pass@2 = 1 - C(n-c,2)/C(4,2): prompt 0: 1 - 3/6 = 0.5; prompt 1: 1 - 0/6 = 1 -> 0.75
    # pass@4: both prompts have a pass -> 1
    assert (m["eval/ds-pass@1"], m["eval/ds-pass@2"], m["eval/ds-pass@4"]) == (0.5, 0.75, 1.0)
    assert "eval/ds-pass@8" not in m


def test_pass_at_k_counts_reward_one_only():
    # the reference counts reward == 1 as a pass: 0.5 and -1 are not passes (a "> 0" rule would count the 0.5)
    samples = [_s() for _ in range(4)]
    m = dataset_metrics("ds", 2, samples, [0.5, 0.0, 1.0, -1.0], passrate=True)
    assert m["eval/ds-pass@1"] == 0.25  # (0/2 + 1/2) / 2
    assert m["eval/ds-pass@2"] == 0.5  # (0 + 1) / 2
    # a group of one sample has no pass@k (the reference logs it only with n > 1)
    assert not any("pass@" in k for k in dataset_metrics("ds", 1, samples, [1.0, 1.0, 0.0, 1.0], passrate=True))
    # without log_passrate (the reference's default) no pass@k at all; the other metrics unchanged
    off = dataset_metrics("ds", 2, samples, [0.5, 0.0, 1.0, -1.0])
    assert not any("pass@" in k for k in off) and off == {k: v for k, v in m.items() if "pass@" not in k}


def test_mixed_versions_are_flagged():
    # per sample, as the reference: a sample generated under two versions is mixed
    two = Sample(response_length=2, status=Status.COMPLETED, weight_versions=[3, 4])
    m = dataset_metrics("ds", 1, [_s(version=3), two], [0, 1])
    assert m["eval/ds/weight_version/mean"] == 3.0  # each sample's oldest version: 3, 3
    assert m["eval/ds/weight_version/mixed_version_ratio"] == 0.5
    assert m["eval/ds/zero_std/count_0.0"] == 1.0 and m["eval/ds/zero_std/count_1.0"] == 1.0  # one-sample groups


@pytest.fixture()
def engine(tiny_model, tiny_tokenizer):
    from miles_core.rollout.hf_engine import HFEngine

    e = HFEngine(tiny_model, tiny_tokenizer)
    e.set_weight_version(3)
    return e


def test_inline_eval_of_live_engine(engine, suite):
    r = run_on_engine(engine, suite, 3)
    assert not r.skipped, r.detail
    assert r.metrics["eval/arith/weight_version/mean"] == 3 and r.metrics["eval/arith/weight_version/mixed_version_ratio"] == 0
    assert 0 <= r.metrics["eval/arith"] <= 1 and r.metrics["eval/duration_seconds"] > 0
    assert {"eval/arith-pass@1", "eval/arith-pass@2"} <= set(r.metrics)
    assert len(r.rows) == 8 and {"prompt", "response", "reward", "weight_version"} <= set(r.rows[0])
    # the same engine asked for another version: the eval does not run
    assert run_on_engine(engine, suite, 4).reason == "pin_violation"


def test_eval_pass_at_k_only_with_log_passrate(engine, tiny_tokenizer):
    from flows.recipes import load_config
    from miles_core.evaluation import build_suite

    cfg = load_config("tiny", {"eval_prompt_data": ["arith", "builtin://arith-test@[0:4]"], "n_samples_per_eval_prompt": 2,
                               "eval_max_response_len": 6, "log_passrate": False})
    r = run_on_engine(engine, build_suite(cfg, tiny_tokenizer), 3)
    assert "eval/arith" in r.metrics and not any("pass@" in k for k in r.metrics)

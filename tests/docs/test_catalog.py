"""The metrics catalog equals the names the code can emit, and the tracker refuses names outside it."""

from __future__ import annotations

import textwrap

import pytest

from miles_core.tracking import catalog
from miles_core.tracking.catalog import AXES, CATALOG, Metric, UncataloguedMetricError, match
from miles_core.tracking.keys import prefix_collisions
from tools.docs import emitted


def test_catalog_equals_the_names_the_code_emits():
    code = emitted.emitted_templates()
    cat = {emitted.normalize(m.name): m for m in CATALOG}
    missing = {t: [f"{e.path}:{e.line}" for e in where] for t, where in code.items() if t not in cat}
    unemitted = sorted(m.name for t, m in cat.items() if t not in code)
    assert not missing, f"emitted but not in miles_core/tracking/catalog.py: {missing}"
    assert not unemitted, f"in the catalog but no code emits them: {unemitted}"


def test_each_entry_names_a_module_that_emits_it():
    code = emitted.emitted_templates()
    for m in CATALOG:
        paths = {e.path for e in code[emitted.normalize(m.name)]}
        assert m.source in paths, f"{m.name}: source {m.source} does not emit it; emitted by {sorted(paths)}"


def test_entries_are_unique_on_their_axis_and_never_directories_of_each_other():
    names = [m.name for m in CATALOG]
    assert len(names) == len(set(names))
    prefix_axis = {"rollout": "rollout/step", "perf": "rollout/step", "passrate": "rollout/step", "multi_turn": "rollout/step", "train": "train/step", "eval": "eval/step"}
    for m in CATALOG:
        assert m.axis in AXES and prefix_axis[m.name.split("/")[0]] == m.axis, m
    assert prefix_collisions([n for n in names if "<" not in n]) == []


@pytest.mark.parametrize("key, name", [
    ("rollout/raw_reward", "rollout/raw_reward"),
    ("passrate/pass@4", "passrate/pass@<k>"),
    ("rollout/zero_std/count_1.0", "rollout/zero_std/count_<r>"),
    ("rollout/zero_std/count_-1.0", "rollout/zero_std/count_<r>"),
    ("rollout/dynamic_filter/drop_zero_std_0.0", "rollout/dynamic_filter/drop_<reason>"),
    ("eval/arith", "eval/<ds>"),
    ("eval/arith-pass@8", "eval/<ds>-pass@<k>"),
    ("eval/arith/response_len/mean", "eval/<ds>/response_len/mean"),
    ("eval/arith-none_reward_ratio", "eval/<ds>-none_reward_ratio"),
    ("eval/my-set/weight_version/mixed_version_ratio", "eval/<ds>/weight_version/mixed_version_ratio"),
    ("eval/arith/zero_std/count_1.0", "eval/<ds>/zero_std/count_<r>"),
    ("train/critic-lr-pg_0", "train/critic-lr-pg_0"),
    ("eval/skipped_busy", "eval/skipped_<reason>"),
    ("eval/duration_seconds", "eval/duration_seconds"),
    ("train/mis_kl", "train/mis_kl"),
])
def test_keys_match_their_entry(key, name):
    assert match(key).name == name


@pytest.mark.parametrize("key", ["train/clip_ratio", "rollout/raw_rewards", "passrate/pass@k", "perf/not_a_timer", "rollout/zero_std/count_x",
                                 "train/value_loss"])
def test_unknown_keys_match_nothing(key):
    assert match(key) is None


@pytest.fixture(scope="module")
def tracker(tmp_path_factory):
    """One SQLite MLflow store for the module (creating one runs MLflow's migrations: seconds)."""
    from miles_core.tracking import MlflowTracker

    tmp = tmp_path_factory.mktemp("mlflow")
    return MlflowTracker(f"sqlite:///{tmp / 'mlflow.db'}", "catalog-test", artifact_location=(tmp / "mlruns").as_uri())


def test_the_tracker_logs_catalogued_keys_and_refuses_others(tracker, monkeypatch):
    monkeypatch.setenv(catalog.CHECK_ENV, "error")  # what the test suite runs with
    tracker.log_metrics({"rollout/raw_reward": 0.5, "passrate/pass@2": 0.75, "rollout/step": 0}, step=0)
    assert tracker.metric_history("passrate/pass_2") == [(0, 0.75)]
    with pytest.raises(UncataloguedMetricError, match="train/clip_ratio"):
        tracker.log_metrics({"train/grad_norm": 1.0, "train/clip_ratio": 0.1}, step=0)
    assert tracker.metric_history("train/grad_norm") == []  # nothing of a refused batch is logged


def test_warn_by_default_and_off_modes(tracker, monkeypatch, caplog):
    monkeypatch.delenv(catalog.CHECK_ENV, raising=False)  # a user's run: warn, never kill the run
    tracker.log_metrics({"train/clip_ratio_warned": 0.1}, step=0)
    assert "train/clip_ratio_warned" in caplog.text
    assert tracker.metric_history("train/clip_ratio_warned") == [(0, 0.1)]
    monkeypatch.setenv(catalog.CHECK_ENV, "off")
    tracker.log_metrics({"train/anything_goes": 0.1}, step=0)
    assert tracker.metric_history("train/anything_goes") == [(0, 0.1)]


def test_a_custom_extension_registers_its_metrics(monkeypatch):
    monkeypatch.setattr(catalog, "_extra", [])
    assert match("train/my_penalty") is None
    catalog.register(Metric("train/my_penalty", "train/step", "a user's metric", "custom_loss_function_path", "my_losses.py"))
    assert match("train/my_penalty").meaning == "a user's metric"


def test_the_scan_finds_a_new_uncatalogued_emitter(tmp_path):
    """Planted: a new metric in an emitter module and one in an algorithm module; the scan reports both."""
    (tmp_path / "miles_core" / "algorithms").mkdir(parents=True)
    (tmp_path / "miles_core" / "rollout").mkdir(parents=True)
    (tmp_path / "miles_core" / "rollout" / "extra.py").write_text(textwrap.dedent('''
        def stats(samples, k):
            """Docstrings that mention rollout/not_a_key are not keys."""
            key = f"rollout/accept/{k}"
            out = {"rollout/new_thing": 1.0, f"{key}-rate": 2.0}
            if key.startswith("rollout/prefix_only"):
                pass
            return out
    '''))
    (tmp_path / "miles_core" / "algorithms" / "new_loss.py").write_text(textwrap.dedent('''
        TABLE = {"not_a_metric": len}
        def loss(x, reduce):
            metrics = {"my_clipfrac": 0.0}
            metrics["my_entropy"] = 1.0
            group = {}
            group["lr"] = 3.0
            w = {"student_p": x, "none": 0.0}[reduce]  # a choice, not a result
            return x, dict(metrics, my_ratio=2.0)
    '''))
    found = {e.template for e in emitted.scan(tmp_path)}
    assert found == {"rollout/new_thing", "rollout/accept/<>", "rollout/accept/<>-rate", "train/my_clipfrac", "train/my_entropy", "train/my_ratio"}
    cat = {emitted.normalize(m.name) for m in CATALOG}
    assert found.isdisjoint(cat)

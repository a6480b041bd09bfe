"""The reference system's flags and metric names against ours: every flag has a line in the compat page (a
field of ours, an alias, a backend issue or a reason), the page is fresh, and the reference metric names we do
not log shrink only to what needs a backend we lack, each with its reason."""

from __future__ import annotations

import pytest

from miles_core.config import ConfigError
from flows.recipes import load_config
from miles_core.config.reference_flags import (ALIASES, BACKEND_FLAGS, BACKEND_GROUPS, KINDS, UNSUPPORTED_FLAGS,
                                               UNSUPPORTED_GROUPS, all_statuses, reference_flags)
from tools.docs import DOCS
from tools.docs.compat import METRICS_NOT_LOGGED, fields, missing_metrics, reference_metrics, own_summary, render_compat


def test_every_reference_flag_has_a_status():
    statuses = all_statuses(fields())
    assert len(statuses) == len(reference_flags()) == 368
    assert all(s.kind in KINDS and (s.field or s.note) for s in statuses)
    assert set(ALIASES.values()) <= fields()


HONOURED_SAME_NAME = 278  # raise it when a flag becomes a field; a fall means a field was dropped or refused again


def test_the_count_of_honoured_same_name_flags_does_not_fall():
    """Same-named fields honoured by code (a NOT_SUPPORTED field counts as unsupported, tools/docs/compat.py)."""
    same = [s.field for s in all_statuses(fields()) if s.kind == "same"]
    assert len(same) >= HONOURED_SAME_NAME, f"{len(same)} reference flags are honoured fields, fewer than {HONOURED_SAME_NAME}"


OWN_HONOURED_SAME_NAME = 263  # of the reference's 348 own flags (flags.tsv kind add), aliases included; issue 34 asked for >= 250


def test_the_count_of_the_reference_own_flags_honoured_does_not_fall():
    """The reference's own flags (not the Megatron-LM ones it re-defaults) that are same-named fields honoured by code."""
    own, reset = own_summary()
    assert sum(own.values()) == 348 and sum(reset.values()) == 20
    honoured = own["same"] + own["alias"]
    assert honoured >= OWN_HONOURED_SAME_NAME, f"{honoured} of the reference's own flags are honoured fields or aliases"


def test_no_row_names_one_of_our_fields():
    """flag_status matches our fields first: a row for a flag that is now a field is never reached (dead)."""
    ours = fields()
    for table in (ALIASES, BACKEND_FLAGS, UNSUPPORTED_FLAGS, BACKEND_GROUPS, UNSUPPORTED_GROUPS):
        assert sorted(set(table) & ours) == [], "rows for flags that are config fields now: drop them"


def test_the_compat_page_is_generated_and_lists_every_flag():
    page = (DOCS / "reference" / "compat.md").read_text(encoding="utf-8")
    assert page == render_compat(), "docs/reference/compat.md is stale: python -m tools.docs generate"
    for flag, _, _ in reference_flags():
        assert f"| `{flag}` |" in page, flag
    assert "NOT EXPLAINED" not in page


def test_reference_metrics_we_do_not_log_are_explained():
    """The metric-name comparison: what is still missing, each with its reason (and no stale reason)."""
    missing = missing_metrics()
    assert [m for m in missing if m not in METRICS_NOT_LOGGED] == []
    assert [m for m in METRICS_NOT_LOGGED if m not in missing] == [], "logged now: drop the reason"
    assert len(reference_metrics()) == 146 and len(missing) <= 53


@pytest.mark.parametrize("key, value, match", [
    ("use_routing_replay", True, "not supported yet: MoE routing replay"),
    ("multi_lora_n_adapters", 2, "not supported yet: miles trains one adapter per run"),
    ("enable_witness", True, "not supported yet: the reference.s forward/backward witness"),
])
def test_a_reference_flag_we_lack_fails_with_its_reason(key, value, match):
    with pytest.raises(ConfigError, match=match):
        load_config("tiny", {key: value})


def test_an_alias_is_renamed_at_load():
    assert str(load_config("tiny", {"save_hf": "runs/hf"}).checkpoint.export) == "runs/hf"


def test_metric_names_snapshot():
    """Every name the catalog holds, against the checked-in list (update tests/docs/metric_names.txt on purpose)."""
    from pathlib import Path

    from miles_core.tracking.catalog import CATALOG

    snapshot = Path(__file__).with_name("metric_names.txt").read_text(encoding="utf-8").splitlines()
    assert sorted(m.name for m in CATALOG) == [line for line in snapshot if line and not line.startswith("#")]


def test_the_readme_says_how_many_reference_flags_map():
    from tools.docs import ROOT
    from tools.docs.compat import summary

    readme, counts = (ROOT / "README.md").read_text(encoding="utf-8"), summary()
    total = sum(counts.values())
    text = readme.replace("\n  ", " ")
    assert f"of the reference's {total} flags, {counts['same']} are" in text
    own, _ = own_summary()
    assert f"({own['same']} of its {sum(own.values())} own flags)" in text
    if counts["backend"]:
        assert f"{counts['alias']} an alias; {counts['backend']} are backend options not implemented yet" in text
        assert f"{counts['unsupported']} are not supported yet" in text
    else:  # every backend flag has a reason of its own now
        assert f"{counts['alias']} an alias; the other {counts['unsupported']} are not supported yet" in text

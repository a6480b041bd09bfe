"""The MILES_FAULT_INJECT parser and attempt counter (miles_core/faults.py)."""

from __future__ import annotations

import logging

import pytest

from miles_core import faults


def test_parse_items_with_default_and_explicit_attempts():
    assert faults.parse("generate@1, train@2x3,,eval@-1") == {("generate", 1): 1, ("train", 2): 3, ("eval", -1): 1}
    assert faults.parse("") == {}


@pytest.mark.parametrize("spec, message", [
    ("generate", "expected <stage>@<id>"),
    ("generate@x", "expected <stage>@<id>"),
    ("generat@1", "unknown stage 'generat'"),
    ("save@1x0", "attempts must be >= 1"),
])
def test_parse_errors_name_the_variable_and_the_item(spec, message):
    with pytest.raises(ValueError, match=message) as e:
        faults.parse(spec)
    assert faults.FAULT_ENV in str(e.value)


def test_inject_raises_the_first_attempts_then_passes(monkeypatch, caplog):
    faults.reset()
    monkeypatch.setenv(faults.FAULT_ENV, "save@3x2")
    faults.inject("save", 2)  # another rollout: no fault
    faults.inject("train", 3)  # another stage: no fault
    with caplog.at_level(logging.WARNING, logger="miles_core.faults"):
        for attempt in (1, 2):
            with pytest.raises(faults.InjectedFault, match=f"stage save at 3 \\(attempt {attempt} of 2"):
                faults.inject("save", 3)
    faults.inject("save", 3)  # the third attempt succeeds
    lines = [r.getMessage() for r in caplog.records if r.name == "miles_core.faults"]
    assert len(lines) == 2 and all(faults.FAULT_ENV in m and "stage save" in m for m in lines)
    monkeypatch.delenv(faults.FAULT_ENV)
    faults.inject("save", 3)  # unset: never raises
    faults.reset()


def test_every_task_has_a_timeout():
    from tools.docs import facts

    tasks = [u for u in facts.prefect_units() if u.kind == "task"]
    assert tasks and all("timeout_seconds" in u.options for u in tasks), [u.name for u in tasks if "timeout_seconds" not in u.options]

"""Fault injection for tests: ``MILES_FAULT_INJECT="<stage>@<id>[x<attempts>]"``, comma-separated.

The first ``attempts`` (default 1) attempts of ``stage`` for ``id`` raise ``InjectedFault``; each
logs one warning naming MILES_FAULT_INJECT and the stage (on the console of ``miles train`` and in the
Prefect run's logs: ``miles_core`` is a Prefect extra logger). Each task of ``tasks/`` calls
``inject(stage, id)`` first, so an injected fault happens before the stage touches any state, and the
suite can prove that Prefect's retry of that stage gives exactly the metrics of a clean run.

The id of each stage is the step of the axis it belongs to:

| stage | id |
|---|---|
| generate, train, save, export, register | the rollout id |
| sync | the weight version the sync makes (1: the sync before the first rollout; i + 2 after rollout i with a sync every rollout) |
| eval | the eval/step it logs (the weight version evaluated: 1 before training, i + 2 after rollout i) |

Attempts are counted per process, for each spec string: a rerun in a new process (the CLI) faults
again unless the variable is changed; ``reset()`` forgets the counts (tests rerunning in one process).
"""

from __future__ import annotations

import logging
import os
import re
from collections import Counter

FAULT_ENV = "MILES_FAULT_INJECT"
STAGES = ("generate", "train", "save", "sync", "eval", "export", "register")
_ITEM = re.compile(r"^(?P<stage>[a-z]+)@(?P<id>-?\d+)(?:x(?P<attempts>\d+))?$")

log = logging.getLogger(__name__)
_attempts: Counter[tuple[str, str, int]] = Counter()  # (spec, stage, id) -> attempts seen in this process


class InjectedFault(RuntimeError):
    """A fault asked for by MILES_FAULT_INJECT."""


def parse(spec: str) -> dict[tuple[str, int], int]:
    """``"generate@1,train@2x3"`` -> {("generate", 1): 1, ("train", 2): 3}. A malformed item raises
    ValueError naming the variable, the item and the expected form."""
    out: dict[tuple[str, int], int] = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        m = _ITEM.match(item)
        if m is None:
            raise ValueError(f"{FAULT_ENV}: bad item {item!r}; expected <stage>@<id>[x<attempts>], e.g. generate@1 or save@0x2")
        stage, attempts = m["stage"], int(m["attempts"] or 1)
        if stage not in STAGES:
            raise ValueError(f"{FAULT_ENV}: unknown stage {stage!r} in {item!r}; stages: {', '.join(STAGES)}")
        if attempts < 1:
            raise ValueError(f"{FAULT_ENV}: attempts must be >= 1 in {item!r}")
        out[(stage, int(m["id"]))] = attempts
    return out


def inject(stage: str, step: int) -> None:
    """Raise InjectedFault if MILES_FAULT_INJECT asks for a fault at this attempt of ``stage`` for ``step``."""
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return
    want = parse(spec).get((stage, step))
    if want is None:
        return
    _attempts[(spec, stage, step)] += 1
    attempt = _attempts[(spec, stage, step)]
    if attempt <= want:
        msg = f"{FAULT_ENV}: injected fault in stage {stage} at {step} (attempt {attempt} of {want} that fail)"
        log.warning(msg)
        raise InjectedFault(msg)


def check() -> None:
    """Parse MILES_FAULT_INJECT now (a typo fails at config load, not at the stage it names)."""
    parse(os.environ.get(FAULT_ENV, ""))


def reset() -> None:
    """Forget the attempts counted in this process."""
    _attempts.clear()

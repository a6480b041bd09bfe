"""The event analyzer (enable_event_analyzer), as the reference's (miles/utils/audit_utils/event_analyzer/analyzer.py
run_analysis / run_analysis_from_args, rules/checksum_compare.py, rules/cross_replica_weight_checksum.py,
rules/inference_engine_weight_checksum_consistency.py): it reads the event dir and runs every rule over it.

    trainer_vs_engines  ours: at each weight version, every engine holds what the trainer sent (each tensor's sha256)
    engines_agree       the reference's inference_engine_weight_checksum_consistency: all engines of one sync hold
                        the same weights
    trainer_replicas    the reference's cross_replica_weight_checksum: the trainer's records of one sync agree
                        (one per replica; the reference compares its train cells)

A mismatch is a ``ChecksumMismatch`` naming the tensor, the two sides, their digests and the weight version;
``check_events`` raises on the first ones (the reference raises ValueError with all of them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from .events import InferenceEngineWeightChecksumEvent, TrainEngineLocalWeightChecksumEvent, read_events

MISSING = "<missing>"


class EventAnalysisError(RuntimeError):
    """The event analyzer found a mismatch; the run fails (the reference's fail fast)."""


@dataclass(frozen=True, kw_only=True)
class ChecksumMismatch:
    key: str  # the tensor name
    weight_version: int
    label_a: str
    label_b: str
    value_a: str
    value_b: str

    def __str__(self) -> str:
        return (f"tensor {self.key!r} at weight version {self.weight_version}: {self.label_a} {self.value_a[:16]} != "
                f"{self.label_b} {self.value_b[:16]}")


def compare(a: dict[str, str], b: dict[str, str], version: int, label_a: str, label_b: str) -> Iterator[ChecksumMismatch]:
    """One mismatch per tensor name (sorted) whose digests differ, or that one side lacks (rules/checksum_compare.py)."""
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, MISSING), b.get(key, MISSING)
        if va != vb:
            yield ChecksumMismatch(key=key, weight_version=version, label_a=label_a, label_b=label_b, value_a=va, value_b=vb)


def trainer_vs_engines(events: list) -> Iterator[ChecksumMismatch]:
    sent = {e.weight_version: e for e in events if isinstance(e, TrainEngineLocalWeightChecksumEvent)}
    for e in events:
        if isinstance(e, InferenceEngineWeightChecksumEvent) and e.weight_version in sent:
            for i, held in enumerate(e.engine_checksums):
                yield from compare(sent[e.weight_version].param_hashes, held, e.weight_version, "trainer sent",
                                   f"engine {i} holds")


def engines_agree(events: list) -> Iterator[ChecksumMismatch]:
    for e in events:
        if isinstance(e, InferenceEngineWeightChecksumEvent):
            for i, held in enumerate(e.engine_checksums[1:], start=1):
                yield from compare(e.engine_checksums[0], held, e.weight_version, "engine 0 holds", f"engine {i} holds")


def trainer_replicas(events: list) -> Iterator[ChecksumMismatch]:
    by_version: dict[int, list[TrainEngineLocalWeightChecksumEvent]] = {}
    for e in events:
        if isinstance(e, TrainEngineLocalWeightChecksumEvent):
            by_version.setdefault(e.weight_version, []).append(e)
    for version, records in sorted(by_version.items()):
        for other in records[1:]:
            yield from compare(records[0].param_hashes, other.param_hashes, version, records[0].source.to_name(),
                               other.source.to_name())


RULES = (trainer_vs_engines, engines_agree, trainer_replicas)


def run_analysis(event_dir: str | Path) -> list[ChecksumMismatch]:
    """Every rule over the events of ``event_dir`` -> the mismatches ([] when there are no events)."""
    events = read_events(event_dir) if Path(event_dir).is_dir() else []
    return [issue for rule in RULES for issue in rule(events)]


def check_events(event_dir: str | Path, when: str) -> None:
    """Raise EventAnalysisError naming the first mismatching tensors and their weight version (``when``: where the run is)."""
    issues = run_analysis(event_dir)
    if issues:
        raise EventAnalysisError(_message(issues, event_dir, when))


def _message(issues: Iterable[ChecksumMismatch], event_dir, when: str) -> str:
    issues = list(issues)
    first = "; ".join(str(i) for i in issues[:3])
    return f"enable_event_analyzer ({when}): {len(issues)} weight checksum mismatches in {event_dir}, first {first}"

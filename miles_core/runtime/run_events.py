"""The Runtime's side of the event logger (save_debug_event_data, save_local_weight_checksum, enable_event_analyzer):
what each stage records, where the reference records it.

    rollout   rollout_generated + metric        (the reference: MetricEvent from its tracking, per rollout)
    train     the analyzer first (the reference's RayTrainGroup.train, group.py:138), then train_step_end + metric
    sync      weight_sync; with save_local_weight_checksum the trainer's digests of what it sent
              (train_engine_local_weight_checksum) and the engines' of what they hold after it
              (inference_engine_weight_checksum; the reference's update_weights, group.py:264-284)
    saved     checkpoint_saved, then the event dir snapshotted with the checkpoint (rollout_manager.py:278)
    restored  the snapshot of the restored checkpoint back as the event dir (rollout_manager.py:58), checkpoint_restored
    finish    the analyzer at the run's end (RolloutManager.dispose, rollout_manager.py:134)

``RunEvents.off()`` does nothing at each call (no event dir).
"""

from __future__ import annotations

import math

from miles_core.config import TrainConfig

from . import event_analyzer, events as ev


def _numbers(metrics: dict) -> dict[str, float]:
    """The metrics as JSON numbers (a NaN or an infinity as null is no number: left out)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}


class RunEvents:
    def __init__(self, cfg: TrainConfig):
        m = cfg.misc
        self.dir = m.event_dir
        self.log = ev.EventLog(self.dir) if self.dir is not None else None
        self.checksums, self.analyze = m.save_local_weight_checksum, m.enable_event_analyzer
        self.save_dir, self.load_dir = cfg.save_dir, cfg.load_dir

    def rollout(self, rollout_id: int, weight_version: int, num_samples: int, metrics: dict) -> None:
        if self.log is not None:
            self.log.log(ev.RolloutGeneratedEvent, rollout_id=rollout_id, weight_version=weight_version, num_samples=num_samples)
            self.log.log(ev.MetricEvent, rollout_id=rollout_id, metrics=_numbers(metrics))

    def before_train(self, rollout_id: int) -> None:
        self.check(f"before the train step of rollout {rollout_id}")

    def train(self, rollout_id: int, out) -> None:
        if self.log is not None:
            self.log.log(ev.TrainStepEndEvent, rollout_id=rollout_id, num_steps=len(out.steps))
            steps = {f"{k}@{i}": v for i, step in enumerate(out.steps) for k, v in step.items()}
            self.log.log(ev.MetricEvent, rollout_id=rollout_id, metrics=_numbers({**out.rollout, **steps}))

    def sync(self, rollout_id: int | None, weight_version: int, weights, engine) -> None:
        """After a sync to ``weight_version``: ``weights`` the WeightSource that sent it, ``engine`` the fleet's engine."""
        if self.log is None:
            return
        self.log.log(ev.WeightSyncEvent, rollout_id=rollout_id, weight_version=weight_version)
        if self.checksums:
            self.log.log(ev.TrainEngineLocalWeightChecksumEvent, source=ev.TRAINER, rollout_id=rollout_id,
                         weight_version=weight_version, param_hashes=weights.checksums())
            self.log.log(ev.InferenceEngineWeightChecksumEvent, rollout_id=rollout_id, weight_version=weight_version,
                         engine_checksums=engine.weight_checksums())

    def saved(self, rollout_id: int) -> None:
        if self.log is None:
            return
        self.log.log(ev.CheckpointSavedEvent, rollout_id=rollout_id, save_dir=str(self.save_dir))
        ev.snapshot(self.dir, self.save_dir, rollout_id)
        kept = {int(p.name) for p in self.save_dir.iterdir() if p.is_dir() and p.name.isdigit()}  # retention's survivors
        ev.prune_snapshots(self.save_dir, kept | {rollout_id})  # (async_save: this one may still be a .tmp- dir)

    def restored(self, meta: dict) -> None:
        if self.log is None:
            return
        ev.restore(self.dir, self.load_dir, meta["rollout_id"])
        self.log.log(ev.CheckpointRestoredEvent, rollout_id=meta["rollout_id"], load_dir=str(self.load_dir),
                     weight_version=meta["weight_version"])

    def check(self, when: str) -> None:
        """enable_event_analyzer: raise EventAnalysisError at the first mismatch of the event dir."""
        if self.analyze:
            event_analyzer.check_events(self.dir, when)

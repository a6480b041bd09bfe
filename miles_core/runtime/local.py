"""The local placement: every part in this process — the trainer (rank 0 of 1) and one in-process HF engine; or,
with rollout_external_engine_addrs, the trainer here and a router over engines already running."""

from __future__ import annotations

from miles_core.config import TrainConfig
from miles_core.rollout.fleet import InProcessFleet
from miles_core.training.backends import TRAINERS
from miles_core.training.protocol import TrainerContext

from .runtime import RunData, RunParts


class LocalWeights:
    """The trainer's tensors as they are (the in-process engine copies them)."""

    def __init__(self, trainer):
        self.trainer = trainer

    def tensors(self):
        return self.trainer.named_tensors()

    def adapter(self):
        return self.trainer.adapter_tensors()

    def checksums(self) -> dict[str, str]:
        from miles_core.weights.disk import adapter_checksums

        return adapter_checksums(self.trainer.named_tensors())


def hf_engine_fleet(cfg: TrainConfig, data: RunData) -> InProcessFleet:
    """One HFEngine on hf_checkpoint (the trainer's starting weights; the first sync makes them the trainer's), on
    ``device`` (miles_core/device.py), where the trainer is."""
    from miles_core.rollout.hf_engine import HFEngine

    from miles_core.rollout.http.options import delta_options

    engine = HFEngine.from_pretrained(data.model_path, cfg.misc.dtype, cfg.cluster.device, tokenizer=data.tokenizer)
    return InProcessFleet(engine, cfg.cluster.update_weight_buffer_size, lora_adapter=cfg.lora.lora_sync_from_tensor,
                          check_adapter=cfg.misc.check_lora_weight_equal, delta=delta_options(cfg))


ENGINE_FLEETS = {"hf": hf_engine_fleet}


class NoEngines:
    """debug_train_only / load_debug_rollout_data: no rollout engine (the rollouts are loaded, the runtime sends no
    weights and runs no eval)."""

    restarts = 0

    @property
    def engine(self):
        raise RuntimeError("debug_train_only: this run has no rollout engine (its rollouts come from load_debug_rollout_data)")

    def before_train(self) -> None:
        """Nothing to release."""

    def update_weights(self, source, version: int) -> dict[str, float]:
        raise RuntimeError("debug_train_only: this run has no rollout engine to send weights to")

    def close(self) -> None:
        """Nothing was started."""


def build_local(cfg: TrainConfig, data: RunData) -> RunParts:
    if cfg.rollout.external_engines:
        return _with_external_engines(cfg, data)
    trainer = _trainer(cfg, data)
    fleet = NoEngines() if cfg.misc.train_only else ENGINE_FLEETS[cfg.cluster.rollout_engine](cfg, data)
    return RunParts(trainer=trainer, fleet=fleet, weights=LocalWeights(trainer))


def _trainer(cfg: TrainConfig, data: RunData):
    from miles_core.rollout.hf_engine import HFEngine

    ctx = TrainerContext(cfg=cfg, model_path=data.model_path, tokenizer=data.tokenizer,
                         make_engine=lambda model: HFEngine(model, data.tokenizer))
    return TRAINERS[cfg.cluster.train_backend](ctx)


def _with_external_engines(cfg: TrainConfig, data: RunData) -> RunParts:
    """rollout_external_engine_addrs: the trainer here, the engines already running elsewhere (probed first, before the
    trainer loads); weights go to them over HTTP (tensor) or through <run_dir>/weight_sync (disk)."""
    from miles_core.rollout.http.external import external_fleet
    from miles_core.weights.sync import WeightSender

    fleet = external_fleet(cfg)
    try:
        trainer = _trainer(cfg, data)
    except BaseException:
        fleet.close()
        raise
    return RunParts(trainer=trainer, fleet=fleet, weights=WeightSender(trainer.named_tensors, trainer.hf_config(),
                                                                       adapter=trainer.adapter_tensors))

"""The EngineFleet protocol: the rollout engines of a run as the Runtime sees them.

    engine          the RolloutEngine the generate loop, the fully-async worker and eval call
                    (generate, versions, pause / continue / flush, health; an EngineRouter also
                    releases and resumes memory)
    before_train    called as the train stage starts: colocated engines release their memory
    update_weights  pause -> flush -> buckets (mode tensor / broadcast / disk) -> version -> continue,
                    from a WeightSource (the trainer's side of a sync)
    restarts        engines restarted by the fleet's health monitor so far
    close           stop what the fleet started

Implementations: ``InProcessFleet`` (one HF engine in this process; here), ``HTTPFleet`` (a router over
HTTP engines speaking the SGLang protocol: our server or SGLang's; rollout/http/fleet.py).
"""

from __future__ import annotations

from typing import Iterable, Protocol

import torch

from .protocol import RolloutEngine


class WeightSource(Protocol):
    """The trainer's side of a weight sync (weights/sync.py WeightSender, or a proxy of train rank 0)."""

    def tensors(self) -> Iterable[tuple[str, torch.Tensor]]: ...
    def adapter(self) -> tuple[dict, list[tuple[str, torch.Tensor]]]: ...  # lora_sync_from_tensor: config + PEFT tensors
    def checksums(self) -> dict[str, str]: ...  # {name: sha256 hex} of what tensors() sends (save_local_weight_checksum)


class EngineFleet(Protocol):
    @property
    def engine(self) -> RolloutEngine: ...
    def before_train(self) -> None: ...
    def update_weights(self, source: WeightSource, version: int) -> dict[str, float]: ...
    @property
    def restarts(self) -> int: ...
    def close(self) -> None: ...


class InProcessFleet:
    """One engine in this process; weights are copied from the trainer's tensors (tensor mode). ``lora_adapter``
    (lora_sync_from_tensor): syncs load the adapter alone and every request runs through it (weights/sync.py).
    ``delta`` (disk-delta: weights/sync.py DeltaOptions): each sync is published under its disk_dir, pulled by the
    engine into its local checkpoint and reloaded from there (sync_delta; the publisher's snapshot lives here)."""

    def __init__(self, engine: RolloutEngine, bucket_bytes: int, lora_adapter: bool = False, check_adapter: bool = False,
                 delta=None):
        self._engine, self.bucket_bytes, self.lora_adapter = engine, bucket_bytes, lora_adapter
        self.check_adapter = check_adapter  # check_lora_weight_equal: the engine checks each adapter's sha256 per tensor
        self.delta, self._publisher = delta, None
        if delta is not None:
            from miles_core.weights.delta import DeltaPublisher

            self._publisher = DeltaPublisher(delta.disk_dir, delta.encoding, delta.checksum)

    @property
    def engine(self) -> RolloutEngine:
        if self.lora_adapter:
            from miles_core.weights.sync import LORA_ADAPTER_NAME

            from .adapters import ThroughAdapter

            return ThroughAdapter(self._engine, LORA_ADAPTER_NAME)
        return self._engine

    def before_train(self) -> None:
        """Nothing to release: the engine and the trainer share this process's memory."""

    def update_weights(self, source: WeightSource, version: int) -> dict[str, float]:
        from miles_core.weights.sync import sync_adapter, sync_delta, sync_weights

        if self.lora_adapter:
            return sync_adapter(source.adapter(), [self._engine], version, check=self.check_adapter)
        if self.delta is not None:
            return sync_delta(source.tensors(), [self._engine], version, self._publisher, self.delta)
        return sync_weights(source.tensors(), [self._engine], version, self.bucket_bytes)

    @property
    def restarts(self) -> int:
        return 0

    def close(self) -> None:
        """The engine lives and dies with this process."""

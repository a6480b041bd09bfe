"""The whole typed config: the argument groups plus derived values and cross-field rules."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from ._base import Group
from .algo import AlgoConfig
from .checkpoint import CheckpointConfig
from .cluster import ClusterConfig
from .data import DataConfig
from .eval import EvalConfig
from .lora import LoraConfig
from .misc import MiscConfig
from .parallel import ParallelConfig
from .rollout import RolloutConfig
from .sglang import SglangConfig
from .tracking import TrackingConfig
from .rules import check_rules

GROUPS: dict[str, type[Group]] = {
    "cluster": ClusterConfig,
    "rollout": RolloutConfig,
    "sglang": SglangConfig,
    "data": DataConfig,
    "algo": AlgoConfig,
    "checkpoint": CheckpointConfig,
    "eval": EvalConfig,
    "tracking": TrackingConfig,
    "parallel": ParallelConfig,
    "lora": LoraConfig,
    "misc": MiscConfig,
}


def critic_dir_of(actor_dir: Path) -> Path:
    """The ppo critic's checkpoint dir beside an actor's: <actor_dir>_critic (the reference's critic_save default)."""
    return actor_dir.with_name(actor_dir.name + "_critic")


class TrainConfig(Group):
    """A resolved training config. Derived values are properties, never written back."""

    form_first = ("rollout", "algo", "misc", "tracking", "checkpoint", "eval", "data")  # the run form: cluster etc. after

    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="Runtime, backend, engine and placement.")
    rollout: RolloutConfig = Field(description="Rollout generation and rewards.")
    sglang: SglangConfig = Field(default_factory=SglangConfig, description="SGLang engine settings (rollout_engine sglang).")
    data: DataConfig = Field(default_factory=DataConfig, description="The prompt dataset.")
    algo: AlgoConfig = Field(default_factory=AlgoConfig, description="Advantages, losses and the optimizer.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Initial model, checkpoints and exports.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Periodic evaluation.")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="MLflow and the mirrors.")
    parallel: ParallelConfig = Field(default_factory=ParallelConfig, description="Megatron parallelism, recompute and batching.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapters.")
    misc: MiscConfig = Field(default_factory=MiscConfig, description="Run identity, dtype, debug switches.")

    @model_validator(mode="after")
    def _cross_field_rules(self) -> "TrainConfig":
        check_rules(self)
        return self

    # ---- derived values -------------------------------------------------------------
    @property
    def n_samples(self) -> int:
        """N = rollout_batch_size * n_samples_per_prompt, samples per rollout."""
        return self.rollout.rollout_batch_size * self.rollout.n_samples_per_prompt

    @property
    def num_steps_per_rollout(self) -> int:
        if self.algo.num_steps_per_rollout is not None:
            return self.algo.num_steps_per_rollout
        if self.algo.global_batch_size is not None:
            return self.n_samples // self.algo.global_batch_size
        return 1

    @property
    def global_batch_size(self) -> int:
        return self.n_samples // self.num_steps_per_rollout

    @property
    def run_dir(self) -> Path:
        return Path(self.misc.run_dir or f"runs/{self.misc.recipe}").absolute()

    @property
    def save_dir(self) -> Path:
        return Path(self.checkpoint.save).absolute() if self.checkpoint.save else self.run_dir / "checkpoints"

    @property
    def load_dir(self) -> Path:
        return Path(self.checkpoint.load).absolute() if self.checkpoint.load else self.save_dir

    @property
    def critic_save_dir(self) -> Path:
        """critic_save, or the save dir with a _critic suffix (the reference's default)."""
        return Path(self.algo.critic_save).absolute() if self.algo.critic_save else critic_dir_of(self.save_dir)

    @property
    def critic_load_dir(self) -> Path:
        """critic_load, or the load dir with a _critic suffix."""
        return Path(self.algo.critic_load).absolute() if self.algo.critic_load else critic_dir_of(self.load_dir)

    @property
    def export_dir(self) -> Path:
        return Path(self.checkpoint.export).absolute() if self.checkpoint.export else self.run_dir / "export"

    @property
    def offload_disk_dir(self) -> Path:
        """offload_train_disk_dir, or <run_dir>/train_offload: the disk files of offload_train_target disk and
        stream_optimizer_state_to_disk (the reference's default, $SCRATCH/miles_train_offload_<uid>, is outside the run)."""
        d = self.parallel.offload_train_disk_dir
        return Path(d).absolute() if d else self.run_dir / "train_offload"

    @property
    def tensorboard_root(self) -> Path:
        """tensorboard_dir, or <run_dir>/tensorboard: TensorBoard's event files and use_pytorch_profiler's traces."""
        return Path(self.tracking.tensorboard_dir).absolute() if self.tracking.tensorboard_dir else self.run_dir / "tensorboard"

    @property
    def memory_snapshot_root(self) -> Path:
        """memory_snapshot_dir, a relative one under the run dir (the reference's is under its working dir)."""
        path = Path(self.misc.memory_snapshot_dir)
        return path if path.is_absolute() else self.run_dir / path

    @property
    def dumper_root(self) -> Path:
        """dumper_dir: the reference's default /tmp/dumper is <run_dir>/dumper here (nothing outside the run dir)."""
        d = self.misc.dumper_dir
        return self.run_dir / "dumper" if d == type(self.misc).model_fields["dumper_dir"].default else Path(d).absolute()

    @property
    def tracking_uri(self) -> str:
        return self.tracking.mlflow_tracking_uri or f"sqlite:///{self.run_dir / 'mlflow.db'}"

    @property
    def needs_ref_model(self) -> bool:
        a = self.algo
        return (a.use_kl_loss and a.kl_loss_coef > 0) or a.kl_coef > 0

    @property
    def offloads_trainer(self) -> bool:
        """offload_train, or its default: on with colocate or offload, except where nothing alternates with the train
        stage (debug_rollout_only, debug_train_only: the reference's arguments.py turns it off with debug_rollout_only)."""
        if self.parallel.offload_train is not None:
            return self.parallel.offload_train
        m = self.misc
        return (self.cluster.colocate or self.cluster.offload) and not (m.debug_rollout_only or m.train_only)

    def flat(self) -> dict[str, object]:
        """Every field by its flat name (names are unique across groups)."""
        return {k: v for g in GROUPS for k, v in getattr(self, g).model_dump().items()}

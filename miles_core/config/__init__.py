"""Typed config: one pydantic model per argument group, composed into TrainConfig."""

from .algo import AlgoConfig
from .checkpoint import CheckpointConfig
from .cluster import ClusterConfig
from .data import DataConfig
from .eval import EvalConfig
from .loader import ConfigError, build_config, field_groups, list_recipes, load_config, read_recipe
from .misc import MiscConfig
from .parallel import ParallelConfig
from .rollout import RolloutConfig
from .sglang import SglangConfig
from .tracking import TrackingConfig
from .train import GROUPS, TrainConfig

__all__ = [
    "AlgoConfig", "CheckpointConfig", "ClusterConfig", "ConfigError", "DataConfig", "EvalConfig", "GROUPS",
    "MiscConfig", "ParallelConfig", "RolloutConfig", "SglangConfig", "TrackingConfig", "TrainConfig", "build_config", "field_groups",
    "list_recipes", "load_config", "read_recipe",
]

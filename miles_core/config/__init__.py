"""Typed config: one pydantic model per argument group, composed into TrainConfig.

Data only: schemas and pure cross-field rules; it imports nothing else of miles_core. Recipes are read by
``loader`` from a directory the caller passes (flows/recipes.py); the registry checks are miles_core/assemble.py's.
"""

from .algo import AlgoConfig
from .checkpoint import CheckpointConfig
from .cluster import ClusterConfig
from .data import DataConfig
from .eval import EvalConfig
from .lora import LoraConfig
from .loader import ConfigError, build_config, field_groups
from .misc import MiscConfig
from .parallel import ParallelConfig
from .rollout import RolloutConfig
from .sglang import SglangConfig
from .tracking import TrackingConfig
from .train import GROUPS, TrainConfig

__all__ = [
    "AlgoConfig", "CheckpointConfig", "ClusterConfig", "ConfigError", "DataConfig", "EvalConfig", "GROUPS", "LoraConfig",
    "MiscConfig", "ParallelConfig", "RolloutConfig", "SglangConfig", "TrackingConfig", "TrainConfig", "build_config", "field_groups",
]

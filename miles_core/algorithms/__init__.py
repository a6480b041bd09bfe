"""RL math: advantage estimators, actor/value losses, KL estimators, rollout correction (TIS/MIS), OPD,
and the reducer. Pure torch; no Prefect or MLflow here.

Conventions: response tokens only, right-padded; per-token tensors [N, T] float32, loss_mask [N, T] 0/1,
rewards [N], group_index [N] long. Name tables: ADVANTAGE_ESTIMATORS (advantage_estimator),
LOSS_FUNCTIONS (loss_type), TIS_FUNCTIONS (custom_tis_function_path), KL_ESTIMATORS (kl types).
"""

from .advantages import ADVANTAGE_ESTIMATORS, AdvantageInputs, compute_advantages
from .kl import KL_ESTIMATORS, kl_estimate
from .losses import LOSS_FUNCTIONS, LossInputs, actor_loss, policy_loss, sft_loss
from .mis import MISConfig, compute_mis_weights
from .ops import entropy_from_logits, masked_mean, masked_whiten
from .policy_loss import ppo_clip
from .reducer import Reducer
from .rollout_correction import TIS_FUNCTIONS
from .tis import TISInputs, vanilla_tis
from .value_loss import value_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS", "KL_ESTIMATORS", "LOSS_FUNCTIONS", "TIS_FUNCTIONS", "AdvantageInputs", "LossInputs",
    "MISConfig", "Reducer", "TISInputs", "actor_loss", "compute_advantages", "compute_mis_weights",
    "entropy_from_logits", "kl_estimate", "masked_mean", "masked_whiten", "policy_loss", "ppo_clip", "sft_loss",
    "value_loss", "vanilla_tis",
]

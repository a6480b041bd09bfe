"""RewardOptions: the reward settings of a run (the ``rm_*`` and reward fields of the config)."""

from __future__ import annotations

from dataclasses import dataclass

from miles_core.rewards.registry import base_rm_type, validate_rm_type


@dataclass(frozen=True, kw_only=True)
class RewardOptions:
    """How samples are scored.

    rm_type: registered family (``RM_TYPES``), optionally ``boxed_``-prefixed; a sample's
        ``metadata["rm_type"]`` overrides it for that sample.
    custom_rm_path: dotted path to ``f(sample)`` (or, with ``group_rm``, ``f(samples)``);
        overrides every rm_type.
    rm_url: the ``remote_rm`` service URL.
    group_rm: score each group (same ``group_index``) with one ``custom_rm_path`` call.
    reward_key: the field to train on when rewards are dicts (see ``reward_value``); for eval,
        build the options with ``reward_key=eval_reward_key``.
    custom_reward_post_process_path: dotted path to ``f(samples, rewards) -> rewards``.
    rm_timeout: seconds per ``remote_rm`` attempt. rm_max_retries: extra attempts after a
        retriable ``remote_rm`` failure.
    """

    rm_type: str = "math"
    custom_rm_path: str | None = None
    rm_url: str | None = None
    group_rm: bool = False
    reward_key: str | None = None
    custom_reward_post_process_path: str | None = None
    rm_timeout: float = 30.0
    rm_max_retries: int = 3

    def __post_init__(self) -> None:
        validate_rm_type(self.rm_type)
        if self.group_rm and not self.custom_rm_path:
            raise ValueError("group_rm=True needs custom_rm_path (a function scoring a list of samples)")
        if base_rm_type(self.rm_type)[1] == "remote_rm" and not self.rm_url and not self.custom_rm_path:
            raise ValueError(f"rm_type {self.rm_type!r} needs rm_url (the reward service URL)")
        if not self.rm_timeout > 0:
            raise ValueError(f"rm_timeout must be > 0 seconds, got {self.rm_timeout!r}")
        if not isinstance(self.rm_max_retries, int) or self.rm_max_retries < 0:
            raise ValueError(f"rm_max_retries must be an integer >= 0, got {self.rm_max_retries!r}")

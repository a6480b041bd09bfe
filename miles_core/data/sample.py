"""The Sample type of REFERENCE §2: one response to one prompt, with everything training needs.

Shapes: ``tokens`` holds prompt + response ids (length P + T); ``loss_mask``,
``rollout_log_probs`` and ``teacher_log_probs`` have length T == ``response_length``.
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass, field, fields
from typing import Any


class Status(str, enum.Enum):
    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


FINISH_STATUS = {"stop": Status.COMPLETED, "length": Status.TRUNCATED, "abort": Status.ABORTED}  # by engine finish reason
_NUMBER_LISTS = frozenset({"tokens", "loss_mask", "rollout_log_probs", "weight_versions", "teacher_log_probs"})


@dataclass
class Sample:
    Status = Status  # the reference's spelling: Sample.Status.TRUNCATED (a class attribute, not a field)

    group_index: int = 0
    index: int = 0
    rollout_id: int = 0
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    teacher_log_probs: list[float] | None = None
    Status = Status  # not a field: ``Sample.Status.COMPLETED`` as the reference's custom functions write it
    remove_sample = False  # not a field: a rollout_sample_filter_path function sets it (its loss mask is zeroed then)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def response_tokens(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    @property
    def effective_response_length(self) -> int:
        """Trainable response tokens (the loss-mask sum), as the reference's Sample."""
        return int(sum(self.loss_mask)) if self.loss_mask else self.response_length

    def get_reward_value(self, args: Any) -> Any:
        """The reference's accessor: the reward, or its field ``args.reward_key`` when that is set."""
        key = getattr(args, "reward_key", None)
        return self.reward[key] if key else self.reward

    def to_dict(self) -> dict[str, Any]:
        """A plain dict of copies of the fields (status as its value); lists of numbers are copied flat, the
        rest deep-copied (``dataclasses.asdict`` walked every element: ~0.3 ms a sample, a rollout file of
        32 samples spent more there than in torch.save)."""
        d = {}
        for f in fields(self):
            v = getattr(self, f.name)
            d[f.name] = list(v) if f.name in _NUMBER_LISTS and v is not None else copy.deepcopy(v) if isinstance(v, (dict, list)) else v
        d["status"] = self.status.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Sample":
        d = dict(d)
        d["status"] = Status(d.get("status", Status.PENDING.value))
        return cls(**d)

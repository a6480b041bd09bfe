"""A data source whose state (cursor: offset, epoch, next group index; the partial-rollout buffer)
is saved with every checkpoint.

The buffer holds groups of samples that a rollout generated but did not use (``partial_rollout``,
see miles_core/rollout/generate.py): the next rollout takes them first, before new prompts. They
are kept here, next to the cursor, because they are what the cursor already handed out: saving
and restoring the two together is what makes a resumed run draw exactly the same groups.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass

from .dataset import Prompt
from .sample import Sample


@dataclass
class Cursor:
    offset: int = 0
    epoch: int = 0
    next_group_index: int = 0


BufferFilter = Callable[[object, None, list, int], list]  # the reference's buffer_filter(args, rollout_id, buffer, n)


class DataSource:
    """Hands out prompts in order (shuffled per epoch with seed + epoch when asked), and buffered groups.
    ``buffer_filter`` (buffer_filter_path, with its ``args``) picks the buffered groups a round takes instead of
    the oldest first: the reference's ``fn(args, rollout_id, buffer, num_samples)``, which removes what it
    returns from ``buffer`` (rollout_id is None, as the reference's RolloutDataSourceWithBuffer passes)."""

    def __init__(self, prompts: list[Prompt], *, shuffle: bool, seed: int, buffer_filter: BufferFilter | None = None,
                 filter_args: object = None):
        self.prompts = prompts
        self.shuffle = shuffle
        self.seed = seed
        self.buffer_filter, self.filter_args = buffer_filter, filter_args
        self.cursor = Cursor()
        self.buffer: list[list[Sample]] = []  # oldest first
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def next_prompts(self, n: int) -> list[tuple[int, Prompt]]:
        """-> n (group_index, prompt) pairs, wrapping into the next epoch."""
        out = []
        for _ in range(n):
            if self.cursor.offset >= len(self._order):
                self.cursor.epoch += 1
                self.cursor.offset = 0
                self._order = self._epoch_order(self.cursor.epoch)
            out.append((self.cursor.next_group_index, self.prompts[self._order[self.cursor.offset]]))
            self.cursor.offset += 1
            self.cursor.next_group_index += 1
        return out

    def take_buffered(self, n: int) -> list[list[Sample]]:
        """Remove and return up to n buffered groups: oldest first, or those buffer_filter picks."""
        if not self.buffer or n == 0:
            return []
        if self.buffer_filter is None:
            taken, self.buffer = self.buffer[:n], self.buffer[n:]
            return taken
        before = len(self.buffer)
        taken = self.buffer_filter(self.filter_args, None, self.buffer, n)
        if not isinstance(taken, list) or len(taken) > n or before - len(self.buffer) != len(taken):
            raise ValueError(f"buffer_filter_path {self.buffer_filter!r} must remove from the buffer the at most {n} groups it "
                             f"returns (as the reference's pop_first); it returned {type(taken).__name__} "
                             f"{len(taken) if isinstance(taken, list) else ''} and the buffer went {before} -> {len(self.buffer)}")
        return taken

    def add_to_buffer(self, groups: list[list[Sample]]) -> None:
        """Keep groups for a later rollout (after those already buffered)."""
        self.buffer.extend(groups)

    def state_dict(self) -> dict:
        """JSON-serialisable: the cursor fields and ``buffer`` (groups of Sample.to_dict())."""
        return {**asdict(self.cursor), "buffer": [[s.to_dict() for s in g] for g in self.buffer]}

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        buffer = state.pop("buffer", [])  # checkpoints written before the buffer existed have none
        self.cursor = Cursor(**state)
        self.buffer = [[Sample.from_dict(d) for d in g] for g in buffer]
        self._order = self._epoch_order(self.cursor.epoch)

"""A data source whose state (cursor: offset, epoch, next group index; the partial-rollout buffer)
is saved with every checkpoint.

The buffer holds groups of samples that a rollout generated but did not use (``partial_rollout``,
see miles_core/rollout/generate.py): the next rollout takes them first, before new prompts. They
are kept here, next to the cursor, because they are what the cursor already handed out: saving
and restoring the two together is what makes a resumed run draw exactly the same groups.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from .dataset import Prompt
from .sample import Sample


@dataclass
class Cursor:
    offset: int = 0
    epoch: int = 0
    next_group_index: int = 0


class DataSource:
    """Hands out prompts in order (shuffled per epoch with seed + epoch when asked), and buffered groups."""

    def __init__(self, prompts: list[Prompt], *, shuffle: bool, seed: int):
        self.prompts = prompts
        self.shuffle = shuffle
        self.seed = seed
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
        """Remove and return up to n buffered groups, oldest first."""
        taken, self.buffer = self.buffer[:n], self.buffer[n:]
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

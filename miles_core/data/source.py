"""A data source whose cursor (offset, epoch, next group index) is saved with every checkpoint."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from .dataset import Prompt


@dataclass
class Cursor:
    offset: int = 0
    epoch: int = 0
    next_group_index: int = 0


class DataSource:
    """Hands out prompts in order (shuffled per epoch with seed + epoch when asked)."""

    def __init__(self, prompts: list[Prompt], *, shuffle: bool, seed: int):
        self.prompts = prompts
        self.shuffle = shuffle
        self.seed = seed
        self.cursor = Cursor()
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

    def state_dict(self) -> dict:
        return asdict(self.cursor)

    def load_state_dict(self, state: dict) -> None:
        self.cursor = Cursor(**state)
        self._order = self._epoch_order(self.cursor.epoch)

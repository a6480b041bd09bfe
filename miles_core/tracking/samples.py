"""The sample table of a rollout (MLflow ``samples/rollout_<id>.json``): ``n`` samples spread across
prompts (round robin over the groups: the first sample of each group, then the second, ...), the
reward next to the response."""

from __future__ import annotations

from collections import defaultdict
from typing import Callable


def spread(samples: list, n: int) -> list:
    """Up to ``n`` samples, one per group in turn (group order as generated), so the table shows many prompts."""
    groups: dict[int, list] = defaultdict(list)
    for s in samples:
        groups[s.group_index].append(s)
    picked, depth = [], 0
    while len(picked) < n and any(depth < len(g) for g in groups.values()):
        picked += [g[depth] for g in groups.values() if depth < len(g)][: n - len(picked)]
        depth += 1
    return picked


def sample_rows(samples: list, n: int, reward: Callable[[object], float],
                extra: Callable[[object], dict] = lambda s: {}) -> list[dict]:
    """Table rows: prompt, response and its reward first, then label, status, group and weight version, then
    ``extra(sample)``'s columns (the conversation of a multi-turn sample)."""
    return [{"prompt": str(s.prompt), "response": s.response, "reward": reward(s.reward), "label": str(s.label),
             "status": s.status.value, "rollout_id": s.rollout_id, "group_index": s.group_index, "weight_version": s.weight_versions[0],
             **extra(s)} for s in spread(samples, n)]

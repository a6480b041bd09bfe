"""The sample table spreads its rows across prompts and puts the reward next to the response."""

from __future__ import annotations

from miles_core.data import Sample
from miles_core.tracking.samples import sample_rows, spread


def _rollout(groups: int, per_group: int) -> list[Sample]:
    return [Sample(group_index=g, index=g * per_group + k, rollout_id=3, prompt=f"p{g}", response=f"r{g}.{k}", label="1",
                   reward=float(k), response_length=1, weight_versions=[4]) for g in range(groups) for k in range(per_group)]


def test_rows_take_one_sample_per_prompt_in_turn():
    picked = spread(_rollout(groups=3, per_group=4), 5)
    # round robin: the first sample of groups 0, 1, 2, then the second of groups 0, 1
    assert [(s.group_index, s.index % 4) for s in picked] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1)]
    assert len(spread(_rollout(groups=2, per_group=2), 10)) == 4  # fewer samples than asked: all of them


def test_reward_sits_next_to_the_response():
    rows = sample_rows(_rollout(groups=2, per_group=2), 3, lambda r: r * 10)
    assert list(rows[0])[:3] == ["prompt", "response", "reward"]
    assert [(r["prompt"], r["response"], r["reward"]) for r in rows] == [("p0", "r0.0", 0.0), ("p1", "r1.0", 0.0), ("p0", "r0.1", 10.0)]
    assert rows[0]["rollout_id"] == 3 and rows[0]["weight_version"] == 4


def test_extra_columns_follow_the_standard_ones():
    rows = sample_rows(_rollout(groups=2, per_group=1), 2, float, extra=lambda s: {"messages": f"conv {s.group_index}"})
    assert list(rows[0])[-1] == "messages" and [r["messages"] for r in rows] == ["conv 0", "conv 1"]

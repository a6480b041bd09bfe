"""The generate loop: prompts -> groups of G samples -> rewards -> (dynamic filter) -> a Rollout.

One rollout takes ``rollout_batch_size`` groups. With ``over_sampling_batch_size`` it samples that
many groups per round, drops groups the filter rejects, and stops once enough groups are kept.
The groups of the last round that were not examined once the batch was full are the reference
system's "aborted" groups (our engines generate a round as one call, so they are already
generated and scored): without ``partial_rollout`` they are discarded, and their prompts with them.

Partial rollout (``partial_rollout``): those groups go to the data source's buffer instead
(``DataSource.add_to_buffer``; saved with the cursor in every checkpoint), and every round takes
buffered groups first (oldest first), then new prompts, up to ``over_sampling_batch_size``
groups. In a round, every sample that is not finished is generated:

- a new sample (PENDING) from its prompt;
- an ABORTED sample (an engine abort returns the tokens generated so far) is continued: the
  request is its prompt + partial response, ``max_new_tokens`` is what its length limit leaves
  (none left -> TRUNCATED without a request), and the new tokens, log-probs and loss mask are
  appended; ``weight_versions`` gets the continuing engine's version appended;
- COMPLETED / TRUNCATED samples of buffered groups are reused as they are (rewards included).

A group with any sample generated in the round is scored as a whole (so ``group_rm`` and reward
post-processing always see whole groups). The filter applies to buffered groups like to new ones.
A buffered sample is off-policy by the syncs since it was generated: ``weight_versions`` records
the engine version of every generation step (``rollout/weight_version/mean`` shows the lag), and
``rollout_id`` is set to the rollout that trains on it. Every group index is handed out once: it
is trained on, dropped by the filter, or still in the buffer.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field, replace

from miles_core.data.dataset import Prompt
from miles_core.data.sample import FINISH_STATUS, Sample, Status
from miles_core.data.source import DataSource
from miles_core.rewards import RewardOptions, batched_async_rm, reward_value

from .filters import load_filter
from .multi_turn import TurnSpec, multi_turn_metrics, resolve_generate_function, zero_failed_rewards
from .multi_turn.custom import run_custom
from .multi_turn.loop import run_turns
from .protocol import GenerateRequest, SamplingParams



@dataclass(frozen=True, kw_only=True)
class RolloutSpec:
    """What the loop needs from the config (hashable, built by the runtime)."""

    rollout_batch_size: int
    n_samples_per_prompt: int
    params: SamplingParams
    max_context_len: int | None = None
    over_sampling_batch_size: int | None = None
    filter_path: str | None = None
    reward_key: str | None = None
    seed: int = 0
    partial_rollout: bool = False
    max_rounds: int = 100  # dynamic sampling gives up (an error) when this many rounds did not keep enough groups
    turns: TurnSpec | None = None  # custom_generate_function_path (multi-turn, tools): who generates (multi_turn/)


@dataclass
class Rollout:
    """The batch of scored samples of one rollout id, plus its metrics."""

    rollout_id: int
    samples: list[Sample]
    metrics: dict[str, float] = field(default_factory=dict)


def spec_filter(spec: RolloutSpec):
    """The dynamic-sampling filter of ``spec`` (None without one); reference-style filters get these args."""
    if not spec.filter_path:
        return None
    return load_filter(spec.filter_path, reward_key=spec.reward_key, n_samples_per_prompt=spec.n_samples_per_prompt,
                       rollout_batch_size=spec.rollout_batch_size, over_sampling_batch_size=spec.over_sampling_batch_size)


def _max_new_tokens(prompt_length: int, spec: RolloutSpec) -> int:
    """The response budget of a prompt: min(max_new_tokens, max_context_len - prompt length, >= 1)."""
    room = spec.params.max_new_tokens
    if spec.max_context_len is not None:
        room = min(room, max(1, spec.max_context_len - prompt_length))
    return room


def new_group(group_index: int, prompt: Prompt, rollout_id: int, G: int) -> list[Sample]:
    """G PENDING samples of one prompt (tokens = the prompt ids, no response yet)."""
    return [
        Sample(group_index=group_index, index=group_index * G + k, rollout_id=rollout_id, prompt=prompt.text,
               tokens=list(prompt.input_ids), label=prompt.label, metadata=dict(prompt.metadata))
        for k in range(G)
    ]


def generate_unfinished(engine, groups: list[list[Sample]], spec: RolloutSpec, seed: int, decode) -> set[int]:
    """Generate (PENDING) or continue (ABORTED) every unfinished sample of `groups`, in one engine
    call (multi-turn: one call per turn; a custom function: its own calls); -> the positions in
    `groups` of the groups that changed."""
    todo: list[tuple[int, Sample, int]] = []  # (group position, sample, tokens left)
    changed = set()
    for gi, group in enumerate(groups):
        for s in group:
            if s.status not in (Status.PENDING, Status.ABORTED):
                continue
            changed.add(gi)
            left = _max_new_tokens(s.prompt_length, spec) - s.response_length
            if left > 0:
                todo.append((gi, s, left))
            else:
                s.status = Status.TRUNCATED  # an aborted sample that had already used its whole budget
    fn = resolve_generate_function(spec.turns.generate_function) if spec.turns and todo else None
    if fn is None:
        _single_turn(engine, todo, spec, seed)
    elif fn.style == "builtin":
        run_turns(engine, [(s, left) for _, s, left in todo], spec, seed, decode)
    else:  # the user's function may return new Sample objects: they take the old ones' places
        outs = run_custom(fn, engine, [(s, left) for _, s, left in todo], spec, seed)
        for (gi, s, left), out in zip(todo, outs):
            groups[gi][groups[gi].index(s)] = out
        todo = [(gi, out, left) for (gi, _, left), out in zip(todo, outs)]
    for _, s, _ in todo:
        s.response = decode(s.response_tokens)
    return changed


def _single_turn(engine, todo: list[tuple[int, Sample, int]], spec: RolloutSpec, seed: int) -> None:
    reqs = [GenerateRequest(list(s.tokens), replace(spec.params, max_new_tokens=left)) for _, s, left in todo]
    results = engine.generate(reqs, seed=seed) if reqs else []
    for (_, s, _), res in zip(todo, results):
        s.tokens = s.tokens + res.output_ids
        s.response_length += len(res.output_ids)
        s.loss_mask = s.loss_mask + [1] * len(res.output_ids)
        s.rollout_log_probs = s.rollout_log_probs + res.output_log_probs
        s.weight_versions = s.weight_versions + [res.weight_version]
        s.status = FINISH_STATUS[res.finish_reason]


def sample_groups(
    engine, source: DataSource, spec: RolloutSpec, rollout_id: int, round_idx: int, decode
) -> tuple[list[list[Sample]], set[int], int]:
    """One round: buffered groups first (partial_rollout), then new prompts, up to the round size,
    with every unfinished sample generated. -> (groups, positions of the groups to score, how many
    groups came from the buffer)."""
    per_round = spec.over_sampling_batch_size or spec.rollout_batch_size
    buffered = source.take_buffered(per_round) if spec.partial_rollout else []
    fresh = [new_group(gi, p, rollout_id, spec.n_samples_per_prompt) for gi, p in source.next_prompts(per_round - len(buffered))]
    groups = buffered + fresh
    changed = generate_unfinished(engine, groups, spec, (spec.seed * 1_000_003 + rollout_id * 1009 + round_idx) % 2**31, decode)
    return groups, changed, len(buffered)


def generate_rollout(engine, source: DataSource, spec: RolloutSpec, reward: RewardOptions, rollout_id: int, decode) -> Rollout:
    """Sample, score and filter until rollout_batch_size groups are kept (see the module docstring)."""
    want = spec.rollout_batch_size
    keep_filter = spec_filter(spec)
    kept: list[list[Sample]] = []
    drops: Counter[str] = Counter()
    reused = 0
    round_idx = 0
    while len(kept) < want:
        groups, changed, n_buffered = sample_groups(engine, source, spec, rollout_id, round_idx, decode)
        reused += n_buffered
        to_score = [s for gi in sorted(changed) for s in groups[gi]]
        for s, r in zip(to_score, asyncio.run(batched_async_rm(to_score, reward))):
            s.reward = r
        zero_failed_rewards(to_score, spec.reward_key)
        for gi, g in enumerate(groups):
            if len(kept) >= want:  # the rest of an over-sampled round is aborted, not filtered (REFERENCE §2)
                if spec.partial_rollout:
                    source.add_to_buffer(groups[gi:])
                break
            verdict = keep_filter(g, lambda s: reward_value(s.reward, spec.reward_key)) if keep_filter else None
            if verdict is not None and not verdict.keep:
                drops[verdict.reason or "filtered"] += 1
            else:
                kept.append(g)
        round_idx += 1
        if len(kept) < want and round_idx >= spec.max_rounds:
            raise RuntimeError(
                f"dynamic sampling kept {len(kept)} of {want} groups in {round_idx} rounds of "
                f"{spec.over_sampling_batch_size or want} (drops: {dict(drops)}); the filter {spec.filter_path} rejects almost "
                "every group: relax it, raise over_sampling_batch_size, or check the rewards")
    samples = [s for g in kept for s in g]
    for s in samples:
        s.rollout_id = rollout_id  # buffered samples are trained in this rollout; weight_versions keeps their age
    metrics = {f"rollout/dynamic_filter/drop_{k}": float(v) for k, v in drops.items()}
    if spec.turns is not None:
        metrics |= multi_turn_metrics(samples)
    if spec.partial_rollout:
        metrics["rollout/partial_rollout/reused_groups"] = float(reused)
        metrics["rollout/partial_rollout/buffer_groups"] = float(len(source.buffer))
    return Rollout(rollout_id, samples, metrics)

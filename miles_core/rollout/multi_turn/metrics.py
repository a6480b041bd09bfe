"""Multi-turn rollout metrics (the reference's names, plus our tool counters), from the samples'
metadata written by loop.py (a custom function may write the same keys; absent ones count 0,
``round_number`` defaults to the number of weight versions, i.e. engine calls).

    multi_turn/raw_response_length/response_length_{mean,max,min,clip_ratio}   all response tokens
    multi_turn/wo_obs_response_length/response_length_{mean,max,min}  model tokens only (loss_mask 1)
    multi_turn/multi_turn_metric/round_number_{mean,max,min}, rollout/round_number (the mean)
    multi_turn/tool_call_ratio        fraction of samples that ran at least one tool call
    multi_turn/tool_calls/mean        tool calls run per sample
    multi_turn/tool_calls/malformed   calls the parser rejected (count); .../incomplete: cut by the length limit
    multi_turn/tool_failures/<reason> samples whose tool failed (error, timeout, non_text): reward 0
"""

from __future__ import annotations

import statistics
from collections import Counter

from miles_core.data.sample import Sample, Status


def multi_turn_metrics(samples: list[Sample]) -> dict[str, float]:
    raw = [float(s.response_length) for s in samples]
    model = [float(sum(s.loss_mask)) for s in samples]
    rounds = [float(s.metadata.get("round_number", len(s.weight_versions))) for s in samples]
    calls = [s.metadata.get("tool_calls", 0) for s in samples]
    m = {
        "multi_turn/raw_response_length/response_length_mean": statistics.fmean(raw),
        "multi_turn/raw_response_length/response_length_max": max(raw),
        "multi_turn/raw_response_length/response_length_min": min(raw),
        "multi_turn/raw_response_length/response_length_clip_ratio": sum(s.status == Status.TRUNCATED for s in samples) / len(samples),
        "multi_turn/wo_obs_response_length/response_length_mean": statistics.fmean(model),
        "multi_turn/wo_obs_response_length/response_length_max": max(model),
        "multi_turn/wo_obs_response_length/response_length_min": min(model),
        "multi_turn/multi_turn_metric/round_number_mean": statistics.fmean(rounds),
        "multi_turn/multi_turn_metric/round_number_max": max(rounds),
        "multi_turn/multi_turn_metric/round_number_min": min(rounds),
        "rollout/round_number": statistics.fmean(rounds),
        "multi_turn/tool_call_ratio": sum(c > 0 for c in calls) / len(samples),
        "multi_turn/tool_calls/mean": statistics.fmean(calls),
        "multi_turn/tool_calls/malformed": float(sum(s.metadata.get("tool_call_malformed", 0) for s in samples)),
        "multi_turn/tool_calls/incomplete": float(sum(s.metadata.get("tool_call_incomplete", 0) for s in samples)),
    }
    for reason, n in Counter(s.metadata["tool_failure"] for s in samples if "tool_failure" in s.metadata).items():
        m[f"multi_turn/tool_failures/{reason}"] = float(n)
    return m


def conversation_columns(s: Sample, tokenizer) -> dict:
    """Sample-table columns of one conversation (log_multi_turn): the whole response with its turn
    markers and tool messages, and the loop's counters."""
    return {"conversation": tokenizer.decode(s.response_tokens, skip_special_tokens=False),
            "round_number": s.metadata.get("round_number", len(s.weight_versions)), "tool_calls": s.metadata.get("tool_calls", 0),
            "tool_failure": s.metadata.get("tool_failure_message", "")}

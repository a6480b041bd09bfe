"""docs/reference/compat.md: every flag of the reference system (miles_core/config/reference/flags.tsv) with
where it stands here (miles_core/config/reference_flags.py), and every metric name the reference logs
(reference/metrics.txt) that our catalog lacks, with the reason (``METRICS_NOT_LOGGED``)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from miles_core.config import GROUPS
from miles_core.config.reference_flags import FLAGS_TSV, all_statuses, own_flags

METRICS_TXT = FLAGS_TSV.parent / "metrics.txt"
SGLANG, MULTI_TURN = "not collected from the SGLang engines yet", "not computed by the multi-turn loop yet"
# reference metric (template) -> why we do not log it; the compat test fails when an entry is logged after all
# or a reference name is neither catalogued nor here
METRICS_NOT_LOGGED: dict[str, str] = {
    "eval/<ds>-truncated_ratio": "the same value as eval/<ds>/truncated_ratio, logged once under that name (docs/decisions.md)",
    "rollout/spec_accept_rate": f"speculative decoding: {SGLANG}",
    "rollout/spec_accept_length": f"speculative decoding: {SGLANG}",
    "rollout/prefix_cache_hit_rate": f"engine cache statistics: {SGLANG}",
    "rollout/avg_cached_tokens_per_sample": f"engine cache statistics: {SGLANG}",
    "eval/<ds>/prefix_cache_hit_rate": f"engine cache statistics: {SGLANG}",
    "rollout/tito_session_mismatch_rate/<v>": f"session server: {MULTI_TURN}",
    "rollout/tito_session_mismatch_rate/<v>/special_token_count": f"session server: {MULTI_TURN}",
    "rollout/tito_session_mismatch_rate/<v>/special_token_type": f"session server: {MULTI_TURN}",
    "rollout/tito_session_mismatch_rate/<v>/non_assistant_text": f"session server: {MULTI_TURN}",
    "rollout/tito_session_mismatch_rate/<v>/assistant_text": f"session server: {MULTI_TURN}",
    "perf/non_generation_time/mean": f"time spent outside generation (tool calls): {MULTI_TURN}",
    "perf/non_generation_time/median": f"time spent outside generation (tool calls): {MULTI_TURN}",
    "perf/non_generation_time/max": f"time spent outside generation (tool calls): {MULTI_TURN}",
    "perf/non_generation_time/min": f"time spent outside generation (tool calls): {MULTI_TURN}",
    "perf/longest_sample_non_generation_time": f"time spent outside generation (tool calls): {MULTI_TURN}",
    "perf/longest_sample_tokens_per_sec_without_non_generation": f"time outside generation: {MULTI_TURN}",
    "perf/longest_effective_sample_non_generation_time": f"time outside generation: {MULTI_TURN}",
    "perf/longest_effective_sample_tokens_per_sec_without_non_generation": f"time outside generation: {MULTI_TURN}",
    "rollout/fully_async/aborted_groups_filtered": "our fully-async buffer never aborts a group (it keeps or recycles)",
    "rollout/fully_async/buffer_avg_staleness": "the staleness of groups still in the buffer is not computed yet",
    "rollout/fully_async/buffer_max_staleness": "the staleness of groups still in the buffer is not computed yet",
    "rollout/teacher_log_probs": "computed by the trainer, not logged yet",
    "perf/reconcile_adapters_time": "multi-LoRA adapter-slot reconciliation before each generate (the reference's "
                                    "reconcile_adapters): multi-LoRA is not built; one adapter's sync is timed in "
                                    "perf/update_weights_time",
    "perf/update_weights_implementation_time": f"the weight-update protocol's inner timing: {SGLANG}",
    "perf/finalize_and_resume_engines_time": f"engine resume timing: {SGLANG}",
    "perf/export_hf_time": "exports log eval/export_time_seconds; a perf/ timer of the export task is not logged yet",
    "perf/data_preprocess_time": "not timed yet (the batch is built inside perf/train_time)",
    "perf/critic_train_time": "not timed apart from perf/train_time yet",
    "perf/ref_model_update_time": "ref_update_interval is not supported",
    "perf/eval_rollout_time": "evals log eval/duration_seconds",
    "perf/cpu_memory_<label>_gb": "host memory is not sampled yet (observability issue)",
    "train/mtp_loss": "multi-token prediction training is not implemented by the megatron trainer yet",
}


def reference_metrics() -> list[str]:
    return [line.strip() for line in METRICS_TXT.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]


def normalize(name: str) -> str:
    return re.sub(r"<[^<>]*>", "<>", name)


def missing_metrics() -> list[str]:
    """Reference metric names our catalog does not hold."""
    from miles_core.tracking.catalog import CATALOG

    ours = {normalize(m.name) for m in CATALOG}
    return [name for name in reference_metrics() if normalize(name) not in ours]


def fields() -> frozenset[str]:
    return frozenset(n for model in GROUPS.values() for n in model.model_fields)


def summary() -> Counter:
    return Counter(s.kind for s in all_statuses(fields()))


def own_summary() -> tuple[Counter, Counter]:
    """The statuses of the reference's own flags, and of the Megatron-LM flags it re-defaults."""
    own = own_flags()
    statuses = all_statuses(fields())
    return (Counter(s.kind for s in statuses if s.flag in own), Counter(s.kind for s in statuses if s.flag not in own))


def _flag_rows() -> list[str]:
    rows = []
    for s in all_statuses(fields()):
        where = {"same": f"`{s.field}`", "alias": f"alias of `{s.field}`", "backend": f"backend issue: {s.note}",
                 "unsupported": f"not supported: {s.note}"}[s.kind]
        default = s.default.replace("|", "\\|") if s.default else ""
        rows.append(f"| `{s.flag}` | {s.group or '(none)'} | {f'`{default}`' if default else ''} | {where} |\n")
    return rows


def render_compat() -> str:
    from .generate import HEADER

    counts, total = summary(), sum(summary().values())
    own, reset = own_summary()
    missing = missing_metrics()
    out = [HEADER.format(source="miles_core/config/reference_flags.py and tools/docs/compat.py"),
           "# Compatibility with the reference system\n\n",
           f"The reference registers {total} flags: {sum(own.values())} of its own and {sum(reset.values())} Megatron-LM "
           f"flags it re-defaults. Of its own flags, {own['same']} are config fields with the same name, "
           f"{own['alias']} an alias of one of ours and {own['unsupported'] + own['backend']} are not supported yet; of the "
           f"re-defaulted ones, {reset['same']} are fields and {reset['unsupported'] + reset['backend']} not supported yet. "
           f"In all: {counts['same']} same-named fields, {counts['alias']} an alias, "
           f"{counts['backend']} options of a backend (Megatron, SGLang, LoRA, multi-turn) that miles does not implement yet and "
           f"{counts['unsupported']} not supported. A reference flag that is not ours fails at load with its "
           "line below, never as an unknown key; an alias is renamed at load.\n\n",
           "| reference flag | group | reference default | here |\n|---|---|---|---|\n", *_flag_rows(),
           f"\n## Metric names the reference logs that miles does not ({len(missing)})\n\n",
           "Every other name of the reference's list is in the [metrics reference](metrics.md).\n\n",
           "| reference metric | why not |\n|---|---|\n"]
    out += [f"| `{name}` | {METRICS_NOT_LOGGED.get(name, 'NOT EXPLAINED')} |\n" for name in missing]
    return "".join(out)

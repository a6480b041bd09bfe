"""The profiling fields' cross-field rules (config/misc.py: use_pytorch_profiler, record_memory_history and theirs;
miles_core/training/profiler.py; docs/performance.md, Profiling), checked by rules.check_rules."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .train import TrainConfig

STEP_TARGETS = ("train_actor", "train_log_probs")  # profilers of one pass, a step per micro-batch
NO_CUDA_HISTORY = ("record_memory_history with memory_recorder torch records the CUDA caching allocator's history "
                   "(torch.cuda.memory._record_memory_history), and a CPU run allocates nothing through it")
MEMRAY_WHY = ("the reference's memray recorder (host memory, native stacks) needs memray, which is not a dependency of miles "
              "(a 9.6 MB wheel, and textual with it)")


def profile_rules(c: "TrainConfig") -> None:
    m = c.misc
    _unused_options(m)
    on = [n for n in ("use_pytorch_profiler", "record_memory_history") if getattr(m, n)]
    if on and m.debug_rollout_only:
        raise ValueError(f"{' and '.join(on)} with debug_rollout_only: the trainer never steps, so there is nothing to "
                         "profile (a profiler left recording for the whole run); drop one of them")
    if m.use_pytorch_profiler:
        _profiler_rules(c)
    if m.record_memory_history:
        _memory_rules(c)


def _unused_options(m) -> None:
    """An option of a switch that is off would change nothing: refused, naming it."""
    fields = type(m).model_fields
    changed = lambda *names: [n for n in names if getattr(m, n) != fields[n].default]  # noqa: E731
    if not m.use_pytorch_profiler and (set_ := changed("profile_step_start", "profile_step_end")):
        raise ValueError(f"{_these(set_)} only with use_pytorch_profiler (off): set it, or drop {_them(set_)}")
    if not m.record_memory_history and (set_ := changed("memory_snapshot_path", "memory_snapshot_dir",
                                                         "memory_snapshot_num_steps", "memory_recorder")):
        raise ValueError(f"{_these(set_)} only with record_memory_history (off): set it, or drop {_them(set_)}")
    if not (m.use_pytorch_profiler or m.record_memory_history) and changed("profile_target"):
        raise ValueError(f"profile_target {m.profile_target} applies only with use_pytorch_profiler or record_memory_history "
                         "(both off): set one, or drop it")


def _these(names: list[str]) -> str:
    return f"{', '.join(names)} " + ("applies" if len(names) == 1 else "apply")


def _them(names: list[str]) -> str:
    return "it" if len(names) == 1 else "them"


def _profiler_rules(c: "TrainConfig") -> None:
    m = c.misc
    if m.profile_step_end <= m.profile_step_start:
        raise ValueError(f"profile_step_end ({m.profile_step_end}) must be > profile_step_start ({m.profile_step_start}): "
                         "the profiled steps are [profile_step_start, profile_step_end)")
    per_pass = [t for t in STEP_TARGETS if t in m.profile_target]
    if per_pass and "train_overall" in m.profile_target:
        raise ValueError(f"profile_target train_overall with {', '.join(per_pass)}: torch.profiler does not nest (a "
                         "profiler started inside train_overall's crashes the process); profile one or the other")
    if per_pass and c.cluster.train_backend == "megatron":  # the reference's megatron actor refuses them too
        raise ValueError(f"profile_target {', '.join(per_pass)} is not supported yet with train_backend megatron (its "
                         "micro-batch loops run inside megatron-core's forward_backward_func); use train_overall, or "
                         "train_backend torch")


def _memory_rules(c: "TrainConfig") -> None:
    m = c.misc
    if m.memory_recorder == "memray":
        raise ValueError(f"memory_recorder memray is not supported yet ({MEMRAY_WHY}); use memory_recorder torch on "
                         "device cuda")
    if c.cluster.device == "cpu":
        raise ValueError(f"record_memory_history on device cpu: {NO_CUDA_HISTORY}; use device cuda, or drop "
                         "record_memory_history")
    if "train_overall" not in m.profile_target:
        raise ValueError(f"record_memory_history records over train_overall, which profile_target {m.profile_target} "
                         "leaves out: add train_overall to profile_target, or drop record_memory_history")

"""use_pytorch_profiler (profile_target, profile_step_start / _end) and record_memory_history (memory_snapshot_*,
memory_recorder): the reference's TrainProfiler (miles/utils/profile_utils.py). Real torch.profiler traces of a tiny
torch trainer, read back from the gzipped Chrome traces; the flow logs them to a real MLflow store."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from miles_core.config import ConfigError
from miles_core.training.profiler import TRACE_SUFFIX, TrainProfiler
from miles_core.training.torch_trainer import TorchTrainer

from .conftest import PAD, make_cfg, make_samples, tiny_lm

BACKWARD = "autograd::engine::evaluate_function"  # the prefix of every backward node's event
FORWARD = "aten::linear"  # the decoder's projections


def _traces(root: Path, target: str) -> list[set[str]]:
    """The event names of each trace of ``target`` under ``root``, oldest first."""
    files = sorted(root.glob(f"{target}_rank_0.*{TRACE_SUFFIX}"), key=lambda p: int(p.name.split(".")[1]))
    return [{e.get("name", "") for e in json.loads(gzip.decompress(p.read_bytes()))["traceEvents"]} for p in files]


def _steps(names: set[str]) -> set[str]:
    return {n for n in names if n.startswith("ProfilerStep#")}


def _trainer(tmp_path, **over) -> tuple[TorchTrainer, object]:
    """8 samples, 2 optimizer steps of 4 rows in micro-batches of 3 (2 each; the old-policy pass: 3), no reference."""
    cfg = make_cfg(run_dir=str(tmp_path / "run"), num_steps_per_rollout=2, **over)
    return TorchTrainer(tiny_lm(), cfg, pad_id=PAD), cfg


def _train(trainer, rollout_id: int) -> None:
    samples = make_samples()
    trainer.train_rollout(samples, [s.reward for s in samples], rollout_id)


def test_train_overall_traces_only_the_selected_rollouts(tmp_path, one_torch_thread):
    trainer, cfg = _trainer(tmp_path, use_pytorch_profiler=True, profile_step_start=1, profile_step_end=2)
    root = cfg.tensorboard_root
    _train(trainer, 0)
    assert _traces(root, "train_overall") == []  # step 0: before the window
    _train(trainer, 1)
    (names,) = _traces(root, "train_overall")  # step 1 recorded and written when its window closed
    assert _steps(names) == {"ProfilerStep#1"}
    assert FORWARD in names and any(n.startswith(BACKWARD) for n in names) and "Optimizer.step#AdamW.step" in names
    _train(trainer, 2)
    assert len(_traces(root, "train_overall")) == 1  # after the window: nothing more
    assert list(root.glob(f"train_actor*{TRACE_SUFFIX}")) == list(root.glob(f"train_log_probs*{TRACE_SUFFIX}")) == []


def test_train_actor_and_log_probs_trace_each_pass_at_the_selected_micro_batches(tmp_path, one_torch_thread):
    trainer, cfg = _trainer(tmp_path, use_pytorch_profiler=True, profile_target=["train_actor", "train_log_probs"],
                            profile_step_start=1, profile_step_end=2)
    _train(trainer, 0)
    actor, log_probs = _traces(cfg.tensorboard_root, "train_actor"), _traces(cfg.tensorboard_root, "train_log_probs")
    assert len(actor) == 2 and len(log_probs) == 1  # one per optimizer step; one forward-only pass (the old policy's)
    for names in actor:
        assert _steps(names) == {"ProfilerStep#1"}  # the second micro-batch of the step only
        assert FORWARD in names and any(n.startswith(BACKWARD) for n in names)
    (names,) = log_probs
    assert _steps(names) == {"ProfilerStep#1"} and FORWARD in names
    assert not any(n.startswith(BACKWARD) for n in names)  # forward only
    assert list(cfg.tensorboard_root.glob(f"train_overall*{TRACE_SUFFIX}")) == []


def test_a_pass_that_ends_inside_its_window_writes_what_it_recorded(tmp_path, one_torch_thread):
    trainer, cfg = _trainer(tmp_path, use_pytorch_profiler=True, profile_target=["train_log_probs"],
                            profile_step_start=2, profile_step_end=5)
    _train(trainer, 0)
    (names,) = _traces(cfg.tensorboard_root, "train_log_probs")
    assert _steps(names) == {"ProfilerStep#2"}  # 3 micro-batches: steps 0, 1 (warm-up), 2; the window ends with the pass


def test_without_the_profiler_nothing_is_written(tmp_path, one_torch_thread):
    trainer, cfg = _trainer(tmp_path)
    assert trainer.profiler.targets == frozenset() and trainer.engine.profiler is trainer.profiler
    for r in range(2):
        _train(trainer, r)
    assert not cfg.tensorboard_root.exists()


BASE = {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "prompt_data": "builtin://arith"}


@pytest.mark.parametrize(("over", "match"), [
    ({"profile_step_start": 0}, "profile_step_start applies only with use_pytorch_profiler"),
    ({"profile_step_end": 20}, "profile_step_end applies only with use_pytorch_profiler"),
    ({"profile_target": ["train_actor"]}, "profile_target .* applies only with use_pytorch_profiler or record_memory_history"),
    ({"memory_snapshot_num_steps": 2}, "memory_snapshot_num_steps applies only with record_memory_history"),
    ({"memory_snapshot_dir": "snaps", "memory_snapshot_path": "x.pickle"},
     "memory_snapshot_path, memory_snapshot_dir apply only with record_memory_history"),
    ({"use_pytorch_profiler": True, "profile_step_start": 4, "profile_step_end": 4}, "profile_step_end .4. must be > profile_step_start"),
    ({"use_pytorch_profiler": True, "profile_target": ["train_overall", "train_log_probs"]},
     "profile_target train_overall with train_log_probs: torch.profiler does not nest"),
    ({"use_pytorch_profiler": True, "profile_target": ["train_actor"], "train_backend": "megatron"},
     "profile_target train_actor is not supported yet with train_backend megatron"),
    ({"record_memory_history": True}, "record_memory_history on device cpu: .*CUDA caching allocator"),
    ({"record_memory_history": True, "device": "cuda", "memory_recorder": "memray"}, "memory_recorder memray is not supported yet"),
    ({"record_memory_history": True, "device": "cuda", "profile_target": ["train_actor"]},
     "record_memory_history records over train_overall"),
    ({"use_pytorch_profiler": True, "debug_rollout_only": True}, "use_pytorch_profiler with debug_rollout_only"),
    ({"profile_target": ["train_all"]}, "profile_target"),
])
def test_refusals_name_the_field(over, match):
    from miles_core.assemble import build_config

    with pytest.raises(ConfigError, match=match):
        build_config({**BASE, **over})


def test_the_memory_snapshot_is_dumped_after_its_rollouts_on_cuda_and_refused_without(tmp_path):
    """device auto: on a GPU machine the snapshot lands under the run dir after rollout memory_snapshot_num_steps - 1;
    without CUDA the run is refused before any model loads (preflight), naming the field."""
    from miles_core.assemble import build_config
    from miles_core.preflight import PreflightError, preflight

    cfg = build_config({**BASE, "device": "auto", "record_memory_history": True, "memory_snapshot_dir": "snaps",
                        "memory_snapshot_num_steps": 2, "run_dir": str(tmp_path / "run")})
    if not torch.cuda.is_available():
        with pytest.raises(PreflightError, match="record_memory_history with device auto, which is cpu here"):
            preflight(cfg)
        with pytest.raises(ValueError, match="record_memory_history: torch sees no CUDA device"):
            TrainProfiler.of(cfg)
        return
    preflight(cfg)
    trainer = TorchTrainer(tiny_lm().cuda(), make_cfg(**{k: getattr(cfg.misc, k) for k in (
        "record_memory_history", "memory_snapshot_dir", "memory_snapshot_num_steps", "run_dir")}, device="cuda"), pad_id=PAD)
    snaps = tmp_path / "run" / "snaps"
    _train(trainer, 0)
    assert not snaps.exists() or list(snaps.iterdir()) == []
    _train(trainer, 1)
    (snap,) = snaps.iterdir()
    assert snap.name.startswith("memory_snapshot_time") and snap.name.endswith("_rank0_snapshot.pickle")
    import pickle

    assert pickle.loads(snap.read_bytes())["device_traces"]  # the allocator's recorded events

"""The reference's CI checks (its ``ci`` argument group, on with ``ci_test``), on what the stages return.

    check_kl          the first optimizer step of every rollout is on-policy: |train/ppo_kl| < 1e-9 (1e-8 with
                      LoRA), |train/pg_clipfrac| < 1e-10; the run's first step: |train/kl_loss| < 1e-9
                      (miles/backends/training_utils/ci_utils.py: check_kl)
    check_log_probs   rollout 0: rollout/log_probs == rollout/ref_log_probs (abs 1e-8); every rollout:
                      |rollout/log_probs - rollout/rollout_log_probs| <= 0.03 (training_utils/log_utils.py)
    GradNorms         ci_save_grad_norm / ci_load_grad_norm: each step's grad norm saved to, or compared (rel and
                      abs 0.03) with, a path template {role} {rollout_id} {step_id} (ci_utils.py: check_grad_norm)
    model_hashes      a SHA-256 per layer over the trainer's named tensors (name, shape, dtype, bytes), kept in
                      the checkpoint's meta and compared after a restore (megatron_utils/ci_utils.py)
    MetricChecker     ci_metric_checker_key: some eval point must reach ci_metric_checker_threshold, judged at the
                      run's end (miles/utils/metric_checker.py)

A failed check raises CICheckFailed naming the check, the rollout and the values: the stage, then the run, fails.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Iterable

import torch

from miles_core.config import MiscConfig

GRAD_NORM_KEYS = {"actor": "train/grad_norm", "critic": "train/critic-grad_norm"}  # role -> its step metric
_LAYER = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)(?:\.|$)")


class CICheckFailed(AssertionError):
    """A ci_test check failed (the run fails)."""


def check_kl(steps: list[dict[str, float]], rollout_id: int, steps_per_rollout: int, *, lora: bool) -> None:
    """The first step of the rollout trains on the weights that scored logp_old: no KL, no clipping."""
    if not steps:
        return
    first = steps[0]
    kl_tol = 1e-8 if lora else 1e-9  # LoRA: the merged weights the engine gets round differently (the reference's relaxed bound)
    if "train/ppo_kl" in first and "train/pg_clipfrac" in first:
        if not (abs(first["train/ppo_kl"]) < kl_tol and abs(first["train/pg_clipfrac"]) < 1e-10):
            raise CICheckFailed(f"ci_test KL check, rollout {rollout_id} step 0: train/ppo_kl {first['train/ppo_kl']:.3e} "
                                f"(must be < {kl_tol:g}) and train/pg_clipfrac {first['train/pg_clipfrac']:.3e} (< 1e-10): the "
                                "first step is not on-policy. The old-policy pass and the step's forward must compute the "
                                "same log-probs bit for bit: float kernels round differently with the batch shape, so give "
                                "both the same rows (a micro_batch_size dividing global_batch_size, e.g. 1); "
                                "ci_disable_kl_checker skips this check")
    if rollout_id * steps_per_rollout == 0 and "train/kl_loss" in first and not abs(first["train/kl_loss"]) < 1e-9:
        raise CICheckFailed(f"ci_test KL check, the run's first step: train/kl_loss {first['train/kl_loss']:.3e} must be < 1e-9 "
                            "(the policy starts as the reference model)")


def check_log_probs(rollout: dict[str, float], rollout_id: int) -> None:
    """Trainer log-probs against the reference model's (rollout 0, same weights) and the engine's (every rollout)."""
    lp = rollout.get("rollout/log_probs")
    if lp is None:
        return
    ref = rollout.get("rollout/ref_log_probs")
    if rollout_id == 0 and ref is not None and not math.isclose(lp, ref, rel_tol=0.0, abs_tol=1e-8):
        raise CICheckFailed(f"ci_test log-prob check, rollout 0: rollout/log_probs {lp!r} != rollout/ref_log_probs {ref!r} (abs 1e-8): "
                            "the policy and the reference model start from the same weights")
    engine = rollout.get("rollout/rollout_log_probs")
    if engine is not None and not math.isclose(lp, engine, rel_tol=0.0, abs_tol=0.03):
        raise CICheckFailed(f"ci_test log-prob check, rollout {rollout_id}: rollout/log_probs {lp!r} vs the engine's "
                            f"rollout/rollout_log_probs {engine!r} differ by more than 0.03 (ci_disable_logprobs_checker skips this)")


def grad_norm_path(template: str, role: str, rollout_id: int, step_id: int) -> Path:
    return Path(template.format(role=role, rollout_id=rollout_id, step_id=step_id))


def check_grad_norms(misc: MiscConfig, steps: list[dict[str, float]], rollout_id: int) -> None:
    """ci_save_grad_norm: each step's grad norm (per role) saved; ci_load_grad_norm: compared with the saved one."""
    for step_id, step in enumerate(steps):
        for role, key in GRAD_NORM_KEYS.items():
            if key not in step:
                continue
            if misc.ci_save_grad_norm is not None:
                path = grad_norm_path(misc.ci_save_grad_norm, role, rollout_id, step_id)
                path.parent.mkdir(parents=True, exist_ok=True)
                torch.save(float(step[key]), path)
            elif misc.ci_load_grad_norm is not None:
                path = grad_norm_path(misc.ci_load_grad_norm, role, rollout_id, step_id)
                if not path.is_file():
                    raise CICheckFailed(f"ci_load_grad_norm: {path} (the {role} grad norm of rollout {rollout_id} step {step_id}) "
                                        "does not exist; save it with a run with ci_save_grad_norm")
                expected = float(torch.load(path, weights_only=True))
                if not math.isclose(step[key], expected, rel_tol=0.03, abs_tol=0.03):
                    raise CICheckFailed(f"ci_load_grad_norm: the {role} grad norm of rollout {rollout_id} step {step_id} is "
                                        f"{step[key]!r}, {path} holds {expected!r} (rel/abs tolerance 0.03)")


def check_train(misc: MiscConfig, rollout_id: int, rollout: dict[str, float], steps: list[dict[str, float]],
                steps_per_rollout: int, *, lora: bool) -> None:
    """Every train-side check ci_test runs, after the train stage of ``rollout_id``."""
    if not misc.ci_disable_kl_checker:
        check_kl(steps, rollout_id, steps_per_rollout, lora=lora)
    if not misc.ci_disable_logprobs_checker:
        check_log_probs(rollout, rollout_id)
    check_grad_norms(misc, steps, rollout_id)


def _layer_key(name: str) -> str:
    m = _LAYER.search(name)
    return f"layer_{int(m.group(1)):04d}" if m else "non_layer"


def model_hashes(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, str]:
    """{layer_NNNN | non_layer: sha256 over (name, shape, dtype, raw bytes) of its tensors in name order}."""
    tensors = sorted(((n, t.detach().cpu().contiguous()) for n, t in named_tensors), key=lambda nt: nt[0])
    hashers: dict[str, hashlib._Hash] = {}
    for name, t in tensors:
        h = hashers.setdefault(_layer_key(name), hashlib.sha256())
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(str(t.dtype).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return {k: h.hexdigest() for k, h in sorted(hashers.items())}


def compare_model_hashes(expected: dict[str, str] | None, actual: dict[str, str], where: str) -> None:
    if expected is None:
        raise CICheckFailed(f"ci_check_model_hash: the checkpoint {where} has no model hashes (it was saved without ci_save_model_hash)")
    if expected != actual:
        missing, extra = sorted(set(expected) - set(actual)), sorted(set(actual) - set(expected))
        changed = sorted(k for k in set(expected) & set(actual) if expected[k] != actual[k])
        raise CICheckFailed(f"ci_check_model_hash: the weights restored from {where} do not hash to what it recorded: "
                            f"missing={missing[:5]} extra={extra[:5]} mismatched={changed[:5]}")


class MetricChecker:
    """ci_metric_checker_key / _threshold: ``on_eval`` per eval point; ``dispose`` at the run's end fails unless one
    point reached the threshold."""

    def __init__(self, key: str, threshold: float):
        self.key, self.threshold = key, threshold
        self.best: float | None = None

    def on_eval(self, metrics: dict[str, float]) -> None:
        if self.key not in metrics:
            raise CICheckFailed(f"ci_metric_checker_key {self.key!r} is not an eval metric of this run (it has "
                                f"{', '.join(sorted(metrics)[:8])}...)")
        value = float(metrics[self.key])
        self.best = value if self.best is None else max(self.best, value)

    def dispose(self) -> None:
        if self.best is None or not self.best >= self.threshold:
            raise CICheckFailed(f"ci_metric_checker: {self.key} never reached {self.threshold} at an eval point "
                                f"(best {self.best})")

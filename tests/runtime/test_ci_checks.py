"""The reference's ci group (ci_test and its checks: miles_core/runtime/ci_checks.py) on the local runtime: real trainer
steps pass the on-policy and log-prob checks, grad norms saved by one run are compared by the next, checkpoint hashes are
recorded and checked after a restore; tampered records fail naming the check."""

from __future__ import annotations

import json

import pytest
import torch

from flows.recipes import load_config
from miles_core.checkpoint.layout import META_FILE
from miles_core.runtime.ci_checks import (CICheckFailed, MetricChecker, check_grad_norms, check_kl, check_log_probs,
                                        compare_model_hashes, model_hashes)

BASE = {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "rollout_max_response_len": 6, "rm_type": "deterministic_random",
        "lr": 1e-2, "num_threads": 1, "num_rollout": 2, "eval_prompt_data": None, "ci_test": True,
        "use_kl_loss": True, "kl_loss_coef": 0.01}


def _runtime(tmp_path, **over):
    from miles_core.runtime.placement import build_runtime

    return build_runtime(load_config("tiny", {**BASE, "run_dir": str(tmp_path / "run"), **over}))


def test_real_steps_pass_and_a_resumed_rerun_checks_grad_norms_and_model_hashes(tmp_path):
    """Run a: two rollouts, grad norms saved, a checkpoint (with hashes) after rollout 0. Run b restores that checkpoint
    (hashes checked) and trains rollout 1 again: its grad norm is compared with run a's."""
    template = str(tmp_path / "gn" / "{role}_{rollout_id}_{step_id}.pt")
    rt = _runtime(tmp_path / "a", ci_save_grad_norm=template, ci_save_model_hash=True)
    try:
        outs = []
        for i in range(2):
            rt.sync_weights()  # ci_test: the engine must report the version sent
            rt.generate(i)
            outs.append(rt.train(i))  # the KL and log-prob checks pass on real steps
            if i == 0:
                rt.save(0, {})
    finally:
        rt.close()
    assert outs[0].rollout["rollout/ref_log_probs"] == pytest.approx(outs[0].rollout["rollout/log_probs"], abs=1e-8)
    assert sorted(p.name for p in (tmp_path / "gn").iterdir()) == ["actor_0_0.pt", "actor_1_0.pt"]
    assert torch.load(tmp_path / "gn" / "actor_1_0.pt", weights_only=True) == outs[1].steps[0]["train/grad_norm"] > 0
    (meta_path,) = list((tmp_path / "a" / "run" / "checkpoints").glob(f"*/{META_FILE}"))
    hashes = json.loads(meta_path.read_text())["model_hash"]
    assert "non_layer" in hashes and "layer_0000" in hashes
    load = str(tmp_path / "a" / "run" / "checkpoints")
    rt = _runtime(tmp_path / "b", ci_load_grad_norm=template, ci_check_model_hash=True, load=load)
    try:
        assert rt.restore()["rollout_id"] == 0  # the restored weights hash as recorded
        restored = {n: t.detach().clone() for n, t in rt.trainer.named_tensors()}
        rt.generate(1)
        assert rt.train(1).steps[0]["train/grad_norm"] == pytest.approx(outs[1].steps[0]["train/grad_norm"], rel=0.03)
    finally:
        rt.close()
    compare_model_hashes(hashes, model_hashes(restored.items()), "a")
    layer0 = next(n for n in restored if ".layers.0." in n)
    moved = {**restored, layer0: restored[layer0] + 1e-3}  # one weight of layer 0 off what was saved
    with pytest.raises(CICheckFailed, match=r"ci_check_model_hash: .*mismatched=\['layer_0000'\]"):
        compare_model_hashes(hashes, model_hashes(moved.items()), "a")
    with pytest.raises(CICheckFailed, match="has no model hashes .*without ci_save_model_hash"):
        compare_model_hashes(None, model_hashes(restored.items()), "a")


def test_a_grad_norm_off_the_saved_one_fails(tmp_path):
    misc = load_config("tiny", {**BASE, "ci_load_grad_norm": str(tmp_path / "{role}-{rollout_id}-{step_id}.pt")}).misc
    torch.save(2.0, tmp_path / "actor-4-0.pt")
    check_grad_norms(misc, [{"train/grad_norm": 2.05}], 4)  # within 0.03 absolute + 0.03 relative
    with pytest.raises(CICheckFailed, match="the actor grad norm of rollout 4 step 0 is 2.5"):
        check_grad_norms(misc, [{"train/grad_norm": 2.5}], 4)
    with pytest.raises(CICheckFailed, match="actor-4-1.pt .* does not exist"):
        check_grad_norms(misc, [{"train/grad_norm": 2.0}, {"train/grad_norm": 2.0}], 4)


def test_the_checks_on_hand_values():
    check_kl([{"train/ppo_kl": 0.0, "train/pg_clipfrac": 0.0, "train/kl_loss": 0.0}], 0, 1, lora=False)
    with pytest.raises(CICheckFailed, match="KL check, rollout 3 step 0"):
        check_kl([{"train/ppo_kl": 2e-9, "train/pg_clipfrac": 0.0}], 3, 1, lora=False)
    check_kl([{"train/ppo_kl": 2e-9, "train/pg_clipfrac": 0.0}], 3, 1, lora=True)  # LoRA's bound is 1e-8
    with pytest.raises(CICheckFailed, match="the run's first step: train/kl_loss"):
        check_kl([{"train/kl_loss": 1e-6}], 0, 2, lora=False)
    check_kl([{"train/kl_loss": 1e-6}], 1, 2, lora=False)  # only the run's first step starts at the reference
    with pytest.raises(CICheckFailed, match="rollout/ref_log_probs"):
        check_log_probs({"rollout/log_probs": -1.0, "rollout/ref_log_probs": -1.0 + 1e-6}, 0)
    check_log_probs({"rollout/log_probs": -1.0, "rollout/ref_log_probs": -1.5, "rollout/rollout_log_probs": -1.02}, 1)
    with pytest.raises(CICheckFailed, match="differ by more than 0.03"):
        check_log_probs({"rollout/log_probs": -1.0, "rollout/rollout_log_probs": -1.04}, 1)


def test_the_metric_checker_fails_the_run_unless_a_point_reached_the_threshold():
    checker = MetricChecker("eval/arith", 0.5)
    checker.on_eval({"eval/arith": 0.25})
    with pytest.raises(CICheckFailed, match="eval/arith never reached 0.5"):
        checker.dispose()
    checker.on_eval({"eval/arith": 0.5})
    checker.dispose()
    with pytest.raises(CICheckFailed, match="'eval/gsm8k' is not an eval metric"):
        MetricChecker("eval/gsm8k", 0.5).on_eval({"eval/arith": 1.0})


@pytest.mark.parametrize("over, match", [
    ({"ci_test": False, "ci_save_model_hash": True}, "ci_save_model_hash act only with ci_test"),
    ({"ci_metric_checker_key": "eval/arith"}, "ci_metric_checker_key and ci_metric_checker_threshold go together"),
    ({"ci_metric_checker_key": "eval/arith", "ci_metric_checker_threshold": 0.5}, "this run has no eval datasets"),
    ({"ci_save_grad_norm": "a/{rollout}.pt"}, "not a path template of {role}, {rollout_id}, {step_id}"),
    ({"ci_save_grad_norm": "a.pt", "ci_load_grad_norm": "b.pt"}, "set one"),
])
def test_ci_options_are_checked_at_load(over, match):
    with pytest.raises(ValueError, match=match):
        load_config("tiny", {**BASE, **over})


def test_the_train_flows_eval_points_reach_the_metric_checker(tmp_path):
    """flows/evaluate.py hands each eval point that ran to the runtime's checker; finish_checks (the flow's end) judges."""
    from flows.evaluate import _ci_check
    from miles_core.evaluation import PointResult
    from miles_core.runtime import registry

    rt = _runtime(tmp_path, eval_prompt_data=["arith", "builtin://arith@[0:4]"], n_samples_per_eval_prompt=1,
                  ci_metric_checker_key="eval/arith", ci_metric_checker_threshold=2.0)  # a mean reward never reaches 2
    registry.register("ci-test", rt)
    try:
        rt.sync_weights()
        result = rt.evaluate()
        _ci_check("ci-test", PointResult.skip(1, "busy"))  # a point that did not run is not judged
        assert rt.metric_checker.best is None
        _ci_check("ci-test", result)
        assert rt.metric_checker.best == result.metrics["eval/arith"]
        with pytest.raises(CICheckFailed, match="eval/arith never reached 2.0"):
            rt.finish_checks()
    finally:
        registry.release("ci-test")


def test_the_kl_check_is_bit_exact_as_the_reference(tiny_model_dir, tiny_tokenizer):
    """Two steps per rollout: the old-policy pass over 8 rows and the step's forward over 4 round differently in float32
    (~1e-8), which the reference's bound (1e-9) refuses; micro-batches of one row make both passes equal."""
    from transformers import AutoModelForCausalLM

    from miles_core.training.torch_trainer import TorchTrainer
    from tests.training._samples import uneven_samples

    rewards = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    kl = {}
    for mbs in (8, 1):
        cfg = load_config("tiny", {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "num_steps_per_rollout": 2,
                                   "micro_batch_size": mbs, "eval_prompt_data": None})
        trainer = TorchTrainer(AutoModelForCausalLM.from_pretrained(tiny_model_dir), cfg, pad_id=tiny_tokenizer.pad_token_id)
        kl[mbs] = trainer.train_rollout(uneven_samples(tiny_tokenizer), rewards, 0).steps
    with pytest.raises(CICheckFailed, match="give both the same rows"):
        check_kl(kl[8], 1, 2, lora=False)
    check_kl(kl[1], 1, 2, lora=False)

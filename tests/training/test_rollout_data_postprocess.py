"""rollout_data_postprocess_path: the reference's hook on its per-sample training dict, called after the advantages
and before the optimizer steps (its megatron actor.py); what it changes in place is what the steps train on."""

from __future__ import annotations

import copy
import sys
import types

import pytest
import torch

from flows.recipes import load_config
from miles_core.config import ConfigError
from ._samples import uneven_samples as _samples
from ._steps import one_step

REWARDS = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
SEEN = {}


def _double_advantages(args, data):
    SEEN["args"] = args
    for a in data["advantages"]:
        a.mul_(2)  # in place, as the reference's hooks do


def _mask_first_sample(args, data):
    data["loss_masks"][0] = torch.zeros_like(data["loss_masks"][0])  # a new tensor in the list works too


def _change_rewards(args, data):
    data["rewards"][0] = 5.0


def _add_key(args, data):
    data["my_weights"] = [1.0] * len(data["tokens"])


def _set_ref(args, data):
    data["ref_log_probs"] = [torch.zeros(n) for n in data["response_lengths"]]


def _bad_shape(args, data):
    data["advantages"][1] = torch.zeros(1)


@pytest.fixture(scope="module", autouse=True)
def hooks():
    module = types.ModuleType("rollout_data_hooks")
    for fn in (_double_advantages, _mask_first_sample, _change_rewards, _add_key, _set_ref, _bad_shape):
        setattr(module, fn.__name__.lstrip("_"), fn)
    sys.modules["rollout_data_hooks"] = module
    yield
    del sys.modules["rollout_data_hooks"]


@pytest.fixture(scope="module")
def base(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


def _step(base, tok, samples, hook=None, **over):
    """One train_rollout; -> (the gradients at optimizer.step, the weights after, the step's metrics)."""
    model = copy.deepcopy(base)
    _, step, grads, _ = one_step(model, tok, samples, REWARDS, rollout_data_postprocess_path=hook, **over)
    return grads, [p.detach().clone() for p in model.parameters()], step


def test_doubled_advantages_double_the_policy_gradient(base, tiny_tokenizer):
    """GRPO's first step, no KL: the policy gradient is linear in the advantages, so the hook's x2 doubles it
    (unclipped: the grad-norm clip would scale both to the same norm)."""
    plain, _, m0 = _step(base, tiny_tokenizer, _samples(tiny_tokenizer), clip_grad=1e9)
    doubled, _, m1 = _step(base, tiny_tokenizer, _samples(tiny_tokenizer), "rollout_data_hooks.double_advantages", clip_grad=1e9)
    assert any(float(g.abs().max()) > 0 for g in plain)
    for a, b in zip(plain, doubled):
        torch.testing.assert_close(b, 2 * a, rtol=1e-5, atol=1e-8)
    assert m1["train/pg_loss"] == pytest.approx(2 * m0["train/pg_loss"], rel=1e-5, abs=1e-9)
    assert SEEN["args"].rollout_data_postprocess_path == "rollout_data_hooks.double_advantages"  # the reference's args


def test_a_mask_set_by_the_hook_trains_as_the_sample_s_own_mask(base, tiny_tokenizer):
    """Zeroing sample 0's loss mask in the hook gives the weights of a rollout whose sample 0 came masked."""
    _, hooked, _ = _step(base, tiny_tokenizer, _samples(tiny_tokenizer), "rollout_data_hooks.mask_first_sample")
    masked = _samples(tiny_tokenizer)
    masked[0].loss_mask = [0] * masked[0].response_length
    _, direct, _ = _step(base, tiny_tokenizer, masked)
    _, plain, _ = _step(base, tiny_tokenizer, _samples(tiny_tokenizer))
    for a, b in zip(hooked, direct):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    assert any(not torch.equal(a, b) for a, b in zip(hooked, plain))


@pytest.mark.parametrize("hook, match", [
    ("change_rewards", "changed rewards, which this trainer has consumed"),
    ("add_key", r"added \['my_weights'\]"),
    ("set_ref", "set ref_log_probs, which this run does not compute"),
    ("bad_shape", r"advantages\[1\] has shape \(1,\), sample 1's response has"),
])
def test_what_the_hook_cannot_change_is_an_error_naming_it(base, tiny_tokenizer, hook, match):
    with pytest.raises(ValueError, match=f"rollout_data_postprocess_path.*{match}"):
        _step(base, tiny_tokenizer, _samples(tiny_tokenizer), f"rollout_data_hooks.{hook}")


def test_a_path_that_does_not_resolve_fails_at_load_naming_the_field():
    with pytest.raises(ConfigError, match="rollout_data_postprocess_path"):
        load_config("tiny", {"rollout_data_postprocess_path": "no_such_module.fn"})

"""rematerialize_param_from_master_weight on the Megatron trainer (bf16: megatron-core's optimizer with fp32 main
weights): offload_train frees the 16-bit weights without a host copy and onload rebuilds them from the main weights,
which changes no number of the run; check_rematerialize_param_from_master_weight compares the rebuilt weights with a
host copy and names the first one that differs."""

from __future__ import annotations

import pytest
import torch

from miles_core.training.megatron import optim
from miles_core.training.megatron.trainer import MegatronTrainer
from miles_core.training.offload import RematerializeMismatch

PAD = 0
BF16 = {"runtime": "ray", "train_backend": "megatron", "dtype": "bfloat16", "offload_train": True}


@pytest.mark.parametrize("overrides", [{"advantage_estimator": "ppo"}, {"use_distributed_optimizer": True}],
                         ids=["float16-optimizer+critic", "distributed-optimizer"])
def test_rebuilt_weights_equal_parked_ones_bit_for_bit_and_the_host_holds_less(megatron_world, tmp_path, lm, cfg,
                                                                               samples, overrides):
    lm(seed=0).save_pretrained(tmp_path)
    rewards = [s.reward for s in samples]
    runs = {}
    for remat in (False, True):
        mega = MegatronTrainer(cfg(**BF16, **overrides, rematerialize_param_from_master_weight=remat), tmp_path, pad_id=PAD)
        steps = [mega.train_rollout(samples, rewards, 0).steps[0]]
        before = {k: v.clone() for k, v in mega.named_tensors()}
        resident = mega.where()
        mega.offload()
        parked = mega.where()
        mega.onload()
        assert mega.where() == resident
        after = dict(mega.named_tensors())
        assert all(torch.equal(before[k], after[k]) for k in before)  # the cast of the main weights is the step's
        steps.append(mega.train_rollout(samples, rewards, 1).steps[0])
        runs[remat] = (steps, dict(mega.named_tensors()), resident, parked)
        mega.close()
    (s0, w0, res0, park0), (s1, w1, res1, park1) = runs[False], runs[True]
    assert s0 == s1 and all(torch.equal(w0[k], w1[k]) for k in w0)
    assert res0 == res1 and park0.offloaded and park1.offloaded
    assert park0.dropped_bytes == 0 and park0.host_bytes == res0.device_bytes
    # the 16-bit weights (policy, and the ppo critic) are dropped, not parked: every other byte still is
    assert park1.dropped_bytes > 0 and park1.host_bytes + park1.dropped_bytes == res1.device_bytes
    assert park1.host_bytes < park0.host_bytes


@pytest.mark.parametrize("distributed", [False, True])
def test_the_check_passes_and_names_the_parameter_whose_main_weight_was_changed(megatron_world, tmp_path, lm, cfg,
                                                                                 samples, distributed):
    lm(seed=0).save_pretrained(tmp_path)
    config = cfg(**BF16, use_distributed_optimizer=distributed, rematerialize_param_from_master_weight=True,
                 check_rematerialize_param_from_master_weight=True)
    mega = MegatronTrainer(config, tmp_path, pad_id=PAD)
    engine = mega.engine
    mega.train_rollout(samples, [s.reward for s in samples], 0)
    mega.offload()
    where = mega.where()
    weights = sum(p.numel() * p.element_size() for _, p in engine._rematerialized())
    assert where.dropped_bytes > 0 and where.host_bytes >= weights  # the check's copy of the 16-bit weights
    mega.onload()  # rebuilt equal: no error
    named = list(engine._rematerialized())
    name, param = named[2]
    main = next(m for p, m in optim.main_params(engine.optimizer) if p is param)
    with torch.no_grad():
        main.view(-1)[0] += 1.0  # the main weight no longer casts to the 16-bit weight the model has
    mega.offload()
    with pytest.raises(RematerializeMismatch, match=rf"parameter {name} rebuilt from its fp32 main weights differs .*\(1 of"):
        mega.onload()
    assert name.startswith("actor:") and not mega.where().offloaded
    mega.close()

"""offload_train on the local runtime: the stages move the trainer's state (policy, critic, both AdamWs) into host
copies after each weight sync and back before the train stage; a run with it equals one without, bit for bit
(samples, metrics, weights), and the trainer reports where its state is at each point of the schedule.

The stages are called in the train flow's order (flows/train.py): initial sync, then per rollout
generate -> train -> [save] -> sync.
"""

from __future__ import annotations

import pytest
import torch

from flows.recipes import read_recipe
from miles_core.assemble import build_config
from miles_core.runtime.placement import build_runtime

N = 2


def _cfg(run_dir, **over):
    values = {**read_recipe("tiny-ppo"), "run_dir": str(run_dir), "rollout_batch_size": 2, "n_samples_per_prompt": 2,
              "num_steps_per_rollout": 2, "rollout_max_response_len": 4, "num_rollout": N, "eval_prompt_data": None,
              "num_threads": 1, **over}
    return build_config(values)


def _weights(rt) -> dict[str, torch.Tensor]:
    t = rt.trainer.engine
    return {**{f"actor.{k}": v.clone() for k, v in t.model.state_dict().items()},
            **{f"critic.{k}": v.clone() for k, v in t.critic.module.state_dict().items()}}


def test_offload_train_moves_the_state_between_stages_and_changes_no_number(tmp_path, tiny_model_dir):
    runs = {}
    for offload in (False, True):
        rt = build_runtime(_cfg(tmp_path / str(offload), offload_train=offload))
        trainer, seen = rt.trainer, []
        seen.append(trainer.where())  # built: resident
        sync = rt.sync_weights()
        assert ("perf/sleep_time" in sync) == offload
        metrics = []
        for i in range(N):
            seen.append(trainer.where())  # before generate: offloaded since the sync
            metrics.append(rt.generate(i))
            out = rt.train(i)
            assert ("perf/wake_up_time" in out.rollout) == offload
            seen.append(trainer.where())  # after train: resident for the save and the sync
            rt.save(i, {})
            metrics.append(out.rollout | {k: v for k, v in out.steps[-1].items()})
            rt.sync_weights()
        seen.append(trainer.where())
        if offload:
            with pytest.raises(RuntimeError, match=r"named_tensors: the trainer's state is offloaded \(offload_train\)"):
                trainer.named_tensors()  # never a read of the freed storages
            assert [w.offloaded for w in seen] == [False, True, False, True, False, True]
            for resident, parked in zip(seen[0::2], seen[1::2]):  # every byte resident before goes to the host
                assert resident.host_bytes == 0 and parked.device_bytes == 0 and parked.host_bytes == resident.device_bytes
            assert seen[2].device_bytes > seen[0].device_bytes > 0  # trained: gradients and both AdamWs' state moved too
            rt.export(N - 1)  # an export while offloaded brings the state back first
            assert trainer.where().device_bytes == seen[-1].host_bytes
        else:
            assert not any(w.offloaded for w in seen)
        samples = [[s.to_dict() for s in rt.load_rollout(i)] for i in range(N)]
        runs[offload] = (samples, metrics, _weights(rt))
        rt.close()
    (s0, m0, w0), (s1, m1, w1) = runs[False], runs[True]
    assert s0 == s1
    drop = ("perf/", "rollout/staleness")  # timings differ
    for a, b in zip(m0, m1):
        assert {k: v for k, v in a.items() if not k.startswith(drop)} == {k: v for k, v in b.items() if not k.startswith(drop)}
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)


def test_a_restore_into_an_offloading_runtime_resumes_from_the_checkpoint(tmp_path, tiny_model_dir):
    """A resume (restore, then its weight sync) with offload_train: the checkpoint loads into the resident trainer,
    which the sync then offloads; the first train after it onloads and trains from the restored weights."""
    first = build_runtime(_cfg(tmp_path / "run", offload_train=True))
    first.sync_weights()
    first.generate(0)
    first.train(0)
    first.save(0, {})
    saved = _weights(first)
    first.close()
    again = build_runtime(_cfg(tmp_path / "run", offload_train=True))
    meta = again.restore()
    assert meta["rollout_id"] == 0 and again.trainer.where().offloaded
    again.onload_trainer()
    assert all(torch.equal(v, saved[k]) for k, v in _weights(again).items())
    again.close()

"""The local Runtime's save / restore with PPO and partial rollout: N rollouts straight == k rollouts,
checkpoint, a new runtime (as after a SIGKILL) restores, N - k more. Actor and critic weights,
the critic's AdamW state and every sample are equal bit for bit (CPU, one thread).

The stages are called in the train flow's order (flows/train.py): initial sync, then per rollout
generate -> train -> [save] -> sync. Without the flow, Prefect and MLflow this runs in seconds.
"""

from __future__ import annotations

import torch

from miles_core.assemble import build_config
from flows.recipes import read_recipe
from miles_core.runtime.placement import build_runtime

N, K = 4, 2


def _cfg(run_dir):
    values = {**read_recipe("tiny-ppo"), "run_dir": str(run_dir), "rollout_batch_size": 2, "n_samples_per_prompt": 4,
              "num_steps_per_rollout": 2, "rollout_max_response_len": 4, "num_rollout": N, "eval_prompt_data": None,
              "num_threads": 1, "over_sampling_batch_size": 3, "partial_rollout": True}
    return build_config(values)


def _run(rt, ids, save_at=None) -> list[dict]:
    metrics = []
    for i in ids:
        metrics.append(rt.generate(i))
        rt.train(i)
        if i == save_at:
            rt.save(i, {})
        rt.sync_weights()
    return metrics


def _state(rt) -> dict[str, torch.Tensor]:
    t = rt.trainer.engine
    out = {**{f"actor.{k}": v for k, v in t.model.state_dict().items()},
           **{f"critic.{k}": v for k, v in t.critic.module.state_dict().items()}}
    for i, s in t.critic.optimizer.state_dict()["state"].items():
        out |= {f"critic_adam.{i}.{k}": v for k, v in s.items()}
    return out


def _samples(rt) -> list[list[dict]]:
    return [[s.to_dict() for s in rt.load_rollout(i)] for i in range(N)]


def test_ppo_with_partial_rollout_resumes_exactly(tmp_path, tiny_model_dir):
    straight = build_runtime(_cfg(tmp_path / "straight"))
    straight.sync_weights()
    want_metrics = _run(straight, range(N))
    assert straight.source.buffer and want_metrics[-1]["rollout/partial_rollout/buffer_groups"] == 1.0
    assert want_metrics[1]["rollout/partial_rollout/reused_groups"] == 1.0

    first = build_runtime(_cfg(tmp_path / "killed"))
    first.sync_weights()
    _run(first, range(K), save_at=K - 1)
    del first  # the process dies after the save (and the sync that followed it)

    resumed = build_runtime(_cfg(tmp_path / "killed"))
    meta = resumed.restore()
    assert meta["rollout_id"] == K - 1 and meta["data_source"]["buffer"]
    assert resumed.trainer.engine.critic.optimizer.state  # the critic's AdamW moments came back
    got_metrics = _run(resumed, range(K, N))

    want, got = _state(straight), _state(resumed)
    assert want.keys() == got.keys()
    assert [k for k in want if not torch.equal(want[k], got[k])] == []
    assert _samples(resumed) == _samples(straight)
    strip = lambda m: {k: v for k, v in m.items() if not k.startswith("perf/")}  # noqa: E731
    assert [strip(m) for m in got_metrics] == [strip(m) for m in want_metrics[K:]]


def _tiny(run_dir, **over):
    values = {**read_recipe("tiny"), "run_dir": str(run_dir), "rollout_batch_size": 2, "n_samples_per_prompt": 2,
              "rollout_max_response_len": 4, "num_rollout": 4, "eval_prompt_data": None, "num_threads": 1, **over}
    return build_config(values)


def test_start_rollout_id_takes_the_latest_weights_and_the_data_state_before_it(tmp_path, tiny_model_dir):
    """The reference's override: checkpoints of rollouts 0 and 2; start_rollout_id 1 loads rollout 2's weights and
    rollout 0's data state, so rollout 1 is generated again from the same prompts (with the newer weights)."""
    import pytest

    from miles_core.checkpoint.load import list_checkpoints

    first = build_runtime(_tiny(tmp_path))
    first.sync_weights()
    for i in range(3):
        first.generate(i)
        first.train(i)
        if i in (0, 2):
            first.save(i, {})
        first.sync_weights()
    prompts = [s.prompt for s in first.load_rollout(1)]
    latest = {k: v.clone() for k, v in first.trainer.engine.model.state_dict().items()}
    saved = {info.rollout_id: info.meta["data_source"] for info in list_checkpoints(first.cfg.load_dir)}
    del first

    resumed = build_runtime(_tiny(tmp_path, start_rollout_id=1))
    meta = resumed.restore()
    assert meta["rollout_id"] == 2 and resumed.last_trained == 0
    assert resumed.source.state_dict() == saved[0] != saved[2]
    weights = resumed.trainer.engine.model.state_dict()
    assert all(torch.equal(weights[k], v) for k, v in latest.items())  # the latest checkpoint's weights
    resumed.generate(1)
    assert [s.prompt for s in resumed.load_rollout(1)] == prompts
    del resumed

    with pytest.raises(ValueError, match=r"start_rollout_id \(2\) takes the data state of rollout 1 from its checkpoint"):
        build_runtime(_tiny(tmp_path, start_rollout_id=2)).restore()
    with pytest.raises(ValueError, match=r"start_rollout_id \(1\) resumes from a checkpoint, and .* has none"):
        build_runtime(_tiny(tmp_path / "fresh", start_rollout_id=1)).restore()

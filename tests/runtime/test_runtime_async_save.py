"""async_save through the local Runtime: the save stage returns before the checkpoint is on disk; the runtime waits
for it before the next save and when it closes, and prunes rollout files after a checkpoint only once it is complete."""

from __future__ import annotations

from flows.recipes import read_recipe
from miles_core import checkpoint as ckpt
from miles_core.assemble import build_config
from miles_core.runtime.placement import build_runtime


def test_the_runtime_waits_for_a_background_save_before_the_next_one_and_at_close(tmp_path, tiny_model_dir):
    values = {**read_recipe("tiny"), "run_dir": str(tmp_path), "rollout_batch_size": 2, "n_samples_per_prompt": 2,
              "rollout_max_response_len": 4, "num_rollout": 3, "eval_prompt_data": None, "num_threads": 1,
              "async_save": True, "keep_rollouts": 1}
    rt = build_runtime(build_config(values))
    rt.sync_weights()
    for i in range(3):
        rt.generate(i)
        rt.train(i)
        rt.save(i, {})
        if i:  # the previous save was waited for: complete, and only then were the rollout files before it pruned
            assert i - 1 in [c.rollout_id for c in ckpt.list_checkpoints(rt.cfg.save_dir)]
            assert rt.rollouts.exists(i) and not rt.rollouts.exists(i - 1)  # keep_rollouts 1
        rt.sync_weights()
    rt.close()  # waits for the last one, then prunes after it
    latest = ckpt.find_latest(rt.cfg.save_dir)
    assert latest is not None and latest.rollout_id == 2 and latest.verified
    assert rt.rollouts.exists(2) and not rt.rollouts.exists(1)
    assert not list(rt.cfg.save_dir.glob(".tmp-*"))

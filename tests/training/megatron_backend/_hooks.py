"""The Megatron plugin hooks of test_trainer.py, with the reference's signatures (resolved by dotted path: imported
as tests.training.megatron_backend._hooks by the trainer and the test alike). Each call appends what it saw to CALLS."""

from __future__ import annotations

from pathlib import Path

CALLS: list[tuple] = []


def init(args):
    from megatron.core import parallel_state as ps

    CALLS.append(("init", args.tensor_model_parallel_size, ps.model_parallel_is_initialized()))


def before_log_prob(args, model, store_prefix):
    CALLS.append(("log_prob", store_prefix, len(model), model[0].training))


def before_train_step(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    grads = [p.main_grad for p in model[0].parameters() if getattr(p, "main_grad", None) is not None]
    CALLS.append(("train_step", rollout_id, step_id, bool(grads) and all(not g.any() for g in grads), opt_param_scheduler,
                  args.num_steps_per_rollout, optimizer is not None))


def post_save(args, rollout_id, checkpoint_dir, hf_checkpoint_dir):
    CALLS.append(("post_save", rollout_id, Path(checkpoint_dir).name, (Path(checkpoint_dir) / "meta.json").is_file(),
                  hf_checkpoint_dir))

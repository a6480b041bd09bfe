"""The reference's Megatron plugin hooks, called with its signatures at its points (each one a dotted path,
resolved at load by miles_core/assemble.py and again here, on every rank):

    custom_megatron_init_path(args)
        once per trainer, after megatron's model-parallel groups and seeds are set up, before any model is built
        (the reference's megatron_utils/initialize.py ``init``, at its end)
    custom_megatron_before_log_prob_hook_path(args, model, store_prefix)
        before each forward-only pass, the model in eval mode: store_prefix "" for the policy's old log-probs and
        the critic's values, "ref_" for the reference, "teacher_" for the OPD teacher (model.py ``forward_only``)
    custom_megatron_before_train_step_hook_path(args, rollout_id, step_id, model, optimizer, opt_param_scheduler)
        before each optimizer step's forward-backward (step_id: 0.. within the rollout), its gradients zeroed; for
        the actor and, with ppo, the critic (model.py ``train``). opt_param_scheduler is None: miles' learning rate
        comes from training/schedule.py and is set on the optimizer's param groups at the step
    custom_megatron_post_save_hook_path(args, rollout_id, checkpoint_dir, hf_checkpoint_dir)
        on rank 0, after each checkpoint is complete (checkpoint_dir = <save>/<rollout_id>, already renamed into
        place; actor.py ``save_model``). hf_checkpoint_dir is None: miles writes HF snapshots in the export stage
        (export / export_interval), after the save, not as part of it

``args`` is the config under the reference's flag names (resolve.reference_args), ``model`` the list of model
chunks the reference passes: [this rank's DDP-wrapped stage].
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from miles_core.config import TrainConfig
from miles_core.resolve import reference_args, resolve
from miles_core.rollout.multi_turn.spec import reference_args as flat_reference_args

HOOKS = ("custom_megatron_init_path", "custom_megatron_before_log_prob_hook_path",
         "custom_megatron_before_train_step_hook_path", "custom_megatron_post_save_hook_path")
STORE_PREFIX = {"actor": "", "critic": "", "ref": "ref_", "teacher": "teacher_"}  # the reference's, by role


class MegatronHooks:
    """The hooks the config names (a hook it does not name is a no-op); ``rollout_id`` is the rollout in training."""

    def __init__(self, cfg: TrainConfig):
        p = cfg.parallel
        self.fns: dict[str, Callable] = {name: resolve(getattr(p, name), what=name) for name in HOOKS if getattr(p, name)}
        self.args = reference_args(**flat_reference_args(cfg)) if self.fns else None
        self.rollout_id = 0

    def init(self) -> None:
        if fn := self.fns.get("custom_megatron_init_path"):
            fn(self.args)

    def before_log_prob(self, role: str, stage) -> None:
        if fn := self.fns.get("custom_megatron_before_log_prob_hook_path"):
            fn(self.args, [stage], STORE_PREFIX[role])

    def before_train_step(self, step_id: int, stage, optimizer) -> None:
        if fn := self.fns.get("custom_megatron_before_train_step_hook_path"):
            fn(self.args, self.rollout_id, step_id, [stage], optimizer, None)

    def post_save(self, rollout_id: int, checkpoint_dir: Path) -> None:
        """Rank 0 only (the caller checks the rank)."""
        if fn := self.fns.get("custom_megatron_post_save_hook_path"):
            fn(self.args, rollout_id, str(checkpoint_dir), None)

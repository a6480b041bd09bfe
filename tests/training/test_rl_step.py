"""The RL step is written once (training/rl_step.py): both backends run the same function objects over their
engine, neither backend module defines a step of its own, and both engines implement the TrainEngine protocol."""

from __future__ import annotations

import ast
import inspect

from miles_core.training import engine, rl_step, torch_trainer
from miles_core.training.megatron import trainer as megatron_trainer

# what a backend module once defined for itself (the step, its schedule, its teacher log-probs)
STEP = ("train_rollout", "forward_passes", "on_policy", "mean_log_probs", "save", "restore", "_local_passes",
        "_teacher_log_probs", "_advantages", "_optimizer_step", "_actor_step", "_critic_step", "_actor_loss",
        "_value_loss", "_rollout_metrics", "_perf", "_warmup", "_set_lr")


def _members(protocol) -> set[str]:
    return {n for n, v in vars(protocol).items() if not n.startswith("_") and callable(v)}


def test_both_backends_run_the_one_rl_step():
    for trainer in (torch_trainer.TorchTrainer, megatron_trainer.MegatronTrainer):
        assert issubclass(trainer, rl_step.RLTrainer)
        for name in STEP:
            if hasattr(rl_step.RLTrainer, name):
                assert inspect.getattr_static(trainer, name) is inspect.getattr_static(rl_step.RLTrainer, name), (trainer, name)
    assert torch_trainer.TorchTrainer.train_rollout is megatron_trainer.MegatronTrainer.train_rollout


def test_backend_modules_define_no_step():
    for module in (torch_trainer, megatron_trainer):
        tree = ast.parse(inspect.getsource(module))
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assert not defined & set(STEP) - {"save", "restore"}, (module.__name__, defined & set(STEP))
        # save / restore there are the engine's (models and optimizers), not the trainer's (steps_done)
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("Trainer")):
            assert [f.name for f in cls.body if isinstance(f, ast.FunctionDef)] in (["__init__"], ["__init__", "close"])


def test_both_engines_implement_the_train_engine_protocol():
    wanted = _members(engine.TrainEngine)
    assert {"log_probs", "values", "backward", "optimizer_step", "named_tensors", "save", "restore"} <= wanted
    for cls in (torch_trainer.TorchEngine, megatron_trainer.MegatronEngine):
        missing = {n for n in wanted if not callable(getattr(cls, n, None))}
        assert not missing, (cls.__name__, missing)


def test_the_learning_rate_is_the_schedule_module_s():
    source = inspect.getsource(torch_trainer) + inspect.getsource(megatron_trainer)
    assert "warmup" not in source and "lr_warmup_iters" not in source
    assert "learning_rate" in inspect.getsource(rl_step)

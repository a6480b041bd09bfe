"""The PPO critic: value model construction, V_t positions, the critic update, critic-only rollouts,
and the extra modules a checkpoint must save."""

from __future__ import annotations

import pytest
import torch

from miles_core.algorithms import Reducer
from miles_core.training.batch import make_batch
from miles_core.training.critic import build_critic, response_values
from miles_core.training.torch_trainer import TorchTrainer

PAD = 0


def test_build_critic_copies_the_body_and_starts_at_zero(lm, samples):
    policy = lm()
    critic = build_critic(policy)
    body, policy_body = critic.model.state_dict(), policy.model.state_dict()
    assert body.keys() == policy_body.keys()
    assert all(torch.equal(body[k], policy_body[k]) for k in body)
    assert critic.score.out_features == 1 and critic.dropout.p == 0.0
    values = response_values(critic, make_batch(samples, PAD))  # zero head -> V = 0
    assert values.shape == make_batch(samples, PAD).loss_mask.shape
    assert torch.count_nonzero(values) == 0
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(critic.parameters(), policy.parameters()))  # a copy


def test_values_are_read_at_the_state_before_each_response_token(lm, samples):
    critic = build_critic(lm())
    torch.nn.init.normal_(critic.score.weight)
    batch = make_batch(samples, PAD)
    values = response_values(critic, batch)  # [N, T], padded batch
    for i, s in enumerate(samples):  # one unpadded sequence at a time
        out = critic(input_ids=torch.tensor([s.tokens])).logits[0, :, 0]  # [L]
        p, t = s.prompt_length, s.response_length
        torch.testing.assert_close(values[i, :t], out[p - 1 : p - 1 + t], atol=1e-5, rtol=1e-5)


def _critic_step(trainer, batch, old, returns, reduce):
    """One critic step of the shared RL step (rl_step.RLTrainer) over every row: the engine's backward and optimizer step."""
    from miles_core.training.engine import RolloutTensors

    tensors = RolloutTensors(old=None, ref=None, teacher=None, values=old, returns=returns)
    return trainer._critic_step(batch, tensors, range(len(batch)), reduce)


def test_critic_step_fits_the_returns(lm, cfg, samples):
    trainer = TorchTrainer(lm(), cfg(advantage_estimator="ppo", critic_lr=1e-2, value_clip=10.0), pad_id=PAD)
    batch = make_batch(samples, PAD)
    returns = torch.tensor([s.reward for s in samples])[:, None] * batch.loss_mask  # [N, T]
    reduce = Reducer(False, num_samples=len(samples), num_tokens=float(batch.loss_mask.sum()))
    losses = []
    for _ in range(10):
        old = trainer.engine.values(batch)
        metrics = _critic_step(trainer, batch, old, returns, reduce)
        losses.append(metrics["train/critic-value_loss"])
    assert set(metrics) == {"train/critic-value_loss", "train/critic-value_clipfrac", "train/critic-grad_norm", "train/critic-lr-pg_0"}
    assert losses[0] == pytest.approx(0.5, abs=1e-6)  # V = 0, R = 0/1 alternating: mean of per-sample (0 or 1) = 0.5
    assert losses[-1] < 0.5 * losses[0]


def test_value_clip_counts_moved_values(lm, cfg, samples):
    trainer = TorchTrainer(lm(), cfg(advantage_estimator="ppo", value_clip=0.2, micro_batch_size=8), pad_id=PAD)
    batch = make_batch(samples, PAD)
    old = trainer.engine.values(batch) - 1.0  # every value moved by 1 > value_clip
    reduce = Reducer(False, num_samples=len(samples), num_tokens=float(batch.loss_mask.sum()))
    metrics = _critic_step(trainer, batch, old, torch.zeros_like(old), reduce)
    assert metrics["train/critic-value_clipfrac"] == pytest.approx(1.0)
    # clipped branch (old + 0.2 - 0)^2 = 0.64 vs unclipped 0: max = 0.64 on every token
    assert metrics["train/critic-value_loss"] == pytest.approx(0.64, abs=1e-5)


def _params(module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _changed(before, module) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, module.parameters()))


def test_ppo_trainer_critic_only_rollouts_then_both(lm, cfg, samples):
    c = cfg(advantage_estimator="ppo", num_critic_only_steps=1, num_steps_per_rollout=2)
    trainer = TorchTrainer(lm(), c, pad_id=PAD)
    rewards = [s.reward for s in samples]
    actor, critic = _params(trainer.engine.model), _params(trainer.engine.critic.module)
    rollout_metrics, steps = trainer.train_rollout(samples, rewards, rollout_id=0)
    assert not _changed(actor, trainer.engine.model) and _changed(critic, trainer.engine.critic.module)
    assert len(steps) == 2 and all("train/pg_loss" not in s and "train/critic-value_loss" in s for s in steps)
    assert rollout_metrics["rollout/values"] == 0.0  # zero head before the first critic step
    assert "rollout/returns" in rollout_metrics
    rollout_metrics, steps = trainer.train_rollout(samples, rewards, rollout_id=1)
    assert _changed(actor, trainer.engine.model)
    assert {"train/pg_loss", "train/critic-value_loss", "train/critic-value_clipfrac", "train/grad_norm"} <= steps[0].keys()
    assert rollout_metrics["rollout/values"] != 0.0
    assert trainer.steps_done == 4


def test_extra_modules_and_optimizers_for_checkpoints(lm, cfg):
    ppo = TorchTrainer(lm(), cfg(advantage_estimator="ppo"), pad_id=PAD)
    assert set(ppo.engine.extra_modules()) == set(ppo.engine.extra_optimizers()) == {"critic"}
    assert ppo.engine.extra_modules()["critic"] is ppo.engine.critic.module
    assert ppo.engine.extra_optimizers()["critic"] is ppo.engine.critic.optimizer
    grpo = TorchTrainer(lm(), cfg(), pad_id=PAD)
    assert grpo.engine.critic is None and grpo.engine.extra_modules() == {} and grpo.engine.extra_optimizers() == {}


def test_critic_lr_defaults_to_lr(lm, cfg):
    assert TorchTrainer(lm(), cfg(advantage_estimator="ppo", lr=3e-4), pad_id=PAD).engine.critic.lr == 3e-4
    assert TorchTrainer(lm(), cfg(advantage_estimator="ppo", critic_lr=1e-2), pad_id=PAD).engine.critic.lr == 1e-2


def _ppo_trainer(lm, cfg, seed: int) -> TorchTrainer:
    return TorchTrainer(lm(seed=seed), cfg(advantage_estimator="ppo", num_critic_only_steps=1, num_steps_per_rollout=2,
                                           critic_lr=1e-2), pad_id=PAD)


def _state(trainer) -> dict[str, torch.Tensor]:
    return {**{f"actor.{k}": v.clone() for k, v in trainer.engine.model.state_dict().items()},
            **{f"critic.{k}": v.clone() for k, v in trainer.engine.critic.module.state_dict().items()}}


def _train(trainer, rollouts, ids):
    """Rollouts ``ids`` of ``rollouts`` (lists of samples), each one train_rollout with its own id."""
    for i in ids:
        trainer.train_rollout(rollouts[i], [s.reward for s in rollouts[i]], rollout_id=i)


def _straight_and_first(lm, cfg, rollouts):
    """Two ppo trainers of the same init: one through every rollout, one through the first two (to checkpoint)."""
    straight, first = _ppo_trainer(lm, cfg, seed=0), _ppo_trainer(lm, cfg, seed=0)
    _train(straight, rollouts, range(len(rollouts)))
    _train(first, rollouts, range(2))
    return straight, first


@pytest.mark.parametrize("restore_critic_optimizer", [True, False])
def test_ppo_resume_from_a_checkpoint_equals_uninterrupted_training(lm, cfg, sample_factory, tmp_path, restore_critic_optimizer):
    """N = 4 rollouts straight == k = 2 rollouts, checkpoint, a fresh trainer (other init) loads it, 2 more.
    Bit-exact with the critic's AdamW state restored; without it the critic (and then the actor) drift."""
    from miles_core import checkpoint as ckpt

    rollouts = [sample_factory(seed=i) for i in range(4)]
    straight, first = _straight_and_first(lm, cfg, rollouts)
    ckpt.save_checkpoint(tmp_path, 1, model=first.engine.model, optimizer=first.engine.optimizer, state={"steps_done": first.steps_done},
                         extra_tensors=first.engine.extra_modules(), extra_optimizers=first.engine.extra_optimizers())
    assert (tmp_path / "1" / "extra" / "critic.optimizer.pt").is_file()
    resumed = _ppo_trainer(lm, cfg, seed=7)  # as a new process: other weights, fresh optimizers
    meta = ckpt.load_checkpoint(ckpt.find_latest(tmp_path), model=resumed.engine.model, optimizer=resumed.engine.optimizer,
                                extra_modules=resumed.engine.extra_modules(),
                                extra_optimizers=resumed.engine.extra_optimizers() if restore_critic_optimizer else None)
    resumed.steps_done = meta["steps_done"]
    _train(resumed, rollouts, range(2, 4))

    want, got = _state(straight), _state(resumed)
    if restore_critic_optimizer:
        assert all(torch.equal(want[k], got[k]) for k in want), [k for k in want if not torch.equal(want[k], got[k])]
    else:
        assert not all(torch.equal(want[k], got[k]) for k in want if k.startswith("critic."))


def test_critic_lr_warmup_iters_warms_up_the_critic_only(lm, cfg, samples):
    """The reference's --critic-lr-warmup-iters: the critic's rate ramps over its own steps (3: 1/3, 2/3, 1 of critic_lr),
    the actor's lr_warmup_iters does not reach it."""
    batch = make_batch(samples, PAD)
    returns = torch.tensor([s.reward for s in samples])[:, None] * batch.loss_mask  # [N, T]
    reduce = Reducer(False, num_samples=len(samples), num_tokens=float(batch.loss_mask.sum()))

    def rates(**over):
        trainer = TorchTrainer(lm(), cfg(advantage_estimator="ppo", critic_lr=3e-2, **over), pad_id=PAD)
        out = []
        for _ in range(4):
            out.append(_critic_step(trainer, batch, trainer.engine.values(batch), returns, reduce)["train/critic-lr-pg_0"])
            trainer.steps_done += 1  # what RLTrainer._optimizer_step counts after the actor and critic steps
        return out

    assert rates(critic_lr_warmup_iters=3) == pytest.approx([1e-2, 2e-2, 3e-2, 3e-2])
    assert rates(lr_warmup_iters=3) == pytest.approx([3e-2] * 4)


def test_the_critic_saves_to_a_dir_of_its_own_and_resumes_from_it_exactly(lm, cfg, sample_factory, tmp_path):
    """critic_save / critic_load (the reference's <save>_critic default): the engine's save writes the critic's
    weights and AdamW state to <save>_critic/<id>/, the actor's checkpoint no longer holds them, and a fresh trainer
    restored from both dirs trains on exactly as the uninterrupted one; critic_load elsewhere is read from there."""
    import shutil

    rollouts = [sample_factory(seed=i) for i in range(3)]
    straight, first = _straight_and_first(lm, cfg, rollouts)
    first.save(tmp_path / "ckpt", 1, {})
    critic_dir = tmp_path / "ckpt_critic" / "1"
    assert (critic_dir / "model" / "model.safetensors").is_file() and (critic_dir / "optimizer.pt").is_file()
    assert not (tmp_path / "ckpt" / "1" / "extra").exists()
    shutil.move(tmp_path / "ckpt_critic", tmp_path / "elsewhere")
    resumed = TorchTrainer(lm(seed=7), cfg(advantage_estimator="ppo", num_critic_only_steps=1, num_steps_per_rollout=2,
                                           critic_lr=1e-2, critic_load=str(tmp_path / "elsewhere")), pad_id=PAD)
    assert resumed.restore(tmp_path / "ckpt")["rollout_id"] == 1
    _train(resumed, rollouts, [2])
    want, got = _state(straight), _state(resumed)
    assert all(torch.equal(want[k], got[k]) for k in want), [k for k in want if not torch.equal(want[k], got[k])]


def test_a_resume_without_the_critic_of_the_actors_rollout_fails_naming_critic_load(lm, cfg, sample_factory, tmp_path):
    import shutil

    from miles_core.checkpoint import CheckpointError

    trainer = _ppo_trainer(lm, cfg, seed=0)
    trainer.save(tmp_path / "ckpt", 0, {})
    trainer.save(tmp_path / "ckpt", 1, {})
    shutil.rmtree(tmp_path / "ckpt_critic" / "1")  # as a save killed between the two: the actor's 1, the critic's 0
    with pytest.raises(CheckpointError, match=r"critic_load: .*ckpt_critic has no complete checkpoint of rollout 1 .*it has \[0\]"):
        _ppo_trainer(lm, cfg, seed=1).restore(tmp_path / "ckpt")


def test_an_actor_checkpoint_holding_its_critic_still_resumes_it(lm, cfg, sample_factory, tmp_path):
    """Checkpoints from before critic_save kept the critic in the actor's (extra/critic.safetensors): read from there."""
    from miles_core import checkpoint as ckpt

    first = _ppo_trainer(lm, cfg, seed=0)
    first.train_rollout(sample_factory(seed=0), [s.reward for s in sample_factory(seed=0)], rollout_id=0)
    ckpt.save_checkpoint(tmp_path, 0, model=first.engine.model, optimizer=first.engine.optimizer, state={"steps_done": 2},
                         extra_tensors=first.engine.extra_modules(), extra_optimizers=first.engine.extra_optimizers())
    resumed = _ppo_trainer(lm, cfg, seed=7)
    resumed.restore(tmp_path)
    want, got = _state(first), _state(resumed)
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert all(torch.equal(a, b) for a, b in zip(first.engine.critic.optimizer.state_dict()["state"][0].values(),
                                                 resumed.engine.critic.optimizer.state_dict()["state"][0].values()))


def test_async_save_writes_what_the_trainer_held_at_the_save_while_it_trains_on(lm, cfg, sample_factory, tmp_path):
    """async_save on the torch trainer (ppo: the critic's dir too): the save returns at once, the next rollout trains
    meanwhile, and after wait_saves both checkpoints hold the weights and AdamW states of the save's moment: a fresh
    trainer restored from them equals one restored from a synchronous save, bit for bit."""
    rollouts = [sample_factory(seed=i) for i in range(2)]
    restored = {}
    for background in (False, True):
        over = {"advantage_estimator": "ppo", "num_steps_per_rollout": 2, "critic_lr": 1e-2, "async_save": background}
        trainer = TorchTrainer(lm(seed=0), cfg(**over), pad_id=PAD)
        trainer.train_rollout(rollouts[0], [s.reward for s in rollouts[0]], rollout_id=0)
        trainer.save(tmp_path / str(background), 0, {})
        trainer.train_rollout(rollouts[1], [s.reward for s in rollouts[1]], rollout_id=1)  # while it is written
        trainer.wait_saves()
        fresh = TorchTrainer(lm(seed=5), cfg(**over), pad_id=PAD)
        assert fresh.restore(tmp_path / str(background))["rollout_id"] == 0
        restored[background] = (_state(fresh), fresh.engine.critic.optimizer.state_dict()["state"])
    (w0, o0), (w1, o1) = restored[False], restored[True]
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    assert all(torch.equal(o0[i][k], o1[i][k]) for i in o0 for k in o0[i])

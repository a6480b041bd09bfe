"""The torch trainer's disk offload fields (training/disk.py, training/disk_adam.py):

- offload_train_target disk: offload writes every storage of the trained state to a file of its own under
  <offload_train_disk_dir>/train_state/rank0 (no device or host copy kept), onload reads them back and removes them;
  the training continues bit for bit as without offload.
- stream_optimizer_state_to_disk: AdamW's moments are in files between steps (their device storages empty),
  streamed in buckets of offload_train_disk_chunk_mb; fp32 equals plain AdamW bit for bit over several steps and
  through a checkpoint save / restore, bf16 differs a little and learns the same direction.

A 2-layer Qwen2 with a 4096-token vocabulary: its embedding's fp32 moments are 1 MiB (4096 x 32 x 8 bytes), so
chunks of 1 MiB make two buckets (the embedding, the rest).
"""

from __future__ import annotations

import copy

import pytest
import torch

from miles_core.training.torch_trainer import TorchTrainer

from .conftest import PAD, make_cfg, make_samples, tiny_lm

ROLLOUTS = 3  # x 2 optimizer steps each
STREAM = {"stream_optimizer_state_to_disk": True, "offload_train_disk_chunk_mb": 1}


@pytest.fixture(scope="module")
def base():
    return tiny_lm(vocab=4096)


@pytest.fixture(scope="module")
def data():
    samples = make_samples()
    return samples, [s.reward for s in samples]


def _trainer(base, run_dir, **over) -> TorchTrainer:
    return TorchTrainer(copy.deepcopy(base), make_cfg(run_dir=str(run_dir), num_steps_per_rollout=2, **over), pad_id=PAD)


def _flat(trainer) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in trainer.engine.model.parameters()])


def _train(trainer, data, rollouts=range(ROLLOUTS)) -> list:
    return [trainer.train_rollout(*data, i).steps for i in rollouts]


def _adam_state(optimizer) -> list[torch.Tensor]:
    return [v.clone() for s in optimizer.state.values() for k, v in sorted(s.items())]


@pytest.fixture(scope="module")
def plain(base, data, tmp_path_factory):
    """The run without any disk use: metrics of every step, final weights, final AdamW state."""
    t = _trainer(base, tmp_path_factory.mktemp("plain"))
    metrics = _train(t, data)
    return metrics, _flat(t), _adam_state(t.engine.optimizer)


def test_offload_to_disk_parks_every_byte_in_files_and_changes_no_number(base, data, plain, tmp_path):
    t = _trainer(base, tmp_path, offload_train=True, offload_train_target="disk", offload_train_disk_chunk_mb=1)
    d = tmp_path / "train_offload" / "train_state" / "rank0"  # the default dir: <run_dir>/train_offload
    metrics = []
    for i in range(ROLLOUTS):
        metrics += _train(t, data, [i])
        resident = t.engine.where()
        t.engine.offload()
        parked = t.engine.where()
        files = sorted(d.glob("*.bin"))
        assert parked.offloaded and parked.device_bytes == 0 and parked.host_bytes == 0  # no device, no host copy
        assert parked.disk_bytes == resident.device_bytes == sum(f.stat().st_size for f in files) > 0
        assert len(files) > 1 and not list(d.glob("*.part"))  # a file per storage, all complete
        t.engine.onload()
        assert t.engine.where() == resident and not list(d.iterdir())  # read back, files removed
    assert metrics == plain[0]
    assert torch.equal(_flat(t), plain[1])


def test_streamed_fp32_moments_equal_plain_adamw_bit_for_bit(base, data, plain, tmp_path):
    t = _trainer(base, tmp_path, **STREAM)
    moments = t.engine.moments["actor"]
    assert len(moments.buckets) == 2
    metrics = _train(t, data)
    assert metrics == plain[0]
    assert torch.equal(_flat(t), plain[1])
    state = t.engine.optimizer.state
    assert all(s[k].untyped_storage().nbytes() == 0 for s in state.values() for k in ("exp_avg", "exp_avg_sq"))
    numel = sum(p.numel() for p in t.engine.model.parameters())
    assert moments.disk_bytes() == 2 * 4 * numel  # both moments of every parameter, in fp32, in the files
    with t.engine._moments_resident():
        assert all(torch.equal(a, b) for a, b in zip(_adam_state(t.engine.optimizer), plain[2], strict=True))
    assert all(s["exp_avg"].untyped_storage().nbytes() == 0 for s in state.values())  # freed again


def test_streamed_moments_survive_a_checkpoint_save_and_restore(base, data, tmp_path):
    """A save reads the moments back for the checkpoint; a restore writes the loaded ones to the new trainer's files:
    the next step equals the one the first trainer takes."""
    first = _trainer(base, tmp_path / "a", **STREAM)
    _train(first, data, [0])
    first.engine.save(tmp_path / "ckpt", 0, {})
    again = _trainer(base, tmp_path / "b", **STREAM)
    again.engine.restore(tmp_path / "ckpt")
    assert again.engine.moments["actor"].disk_bytes() == first.engine.moments["actor"].disk_bytes() > 0
    assert _train(again, data, [1]) == _train(first, data, [1])
    assert torch.equal(_flat(again), _flat(first))


def test_bf16_moments_differ_a_little_and_learn_the_same_way(base, data, plain, tmp_path):
    t = _trainer(base, tmp_path, **STREAM, stream_optimizer_state_moment_dtype="bf16")
    _train(t, data)
    assert t.engine.moments["actor"].disk_bytes() == 2 * 2 * sum(p.numel() for p in t.engine.model.parameters())
    w0 = torch.cat([p.detach().flatten() for p in base.parameters()])
    fp32, bf16 = plain[1] - w0, _flat(t) - w0  # the updates of the 6 steps
    assert not torch.equal(bf16, fp32)  # rounded moments: another run
    assert (bf16 - fp32).norm() < 0.02 * fp32.norm()  # measured 0.0011
    assert torch.nn.functional.cosine_similarity(bf16, fp32, dim=0) > 0.999


def test_ppo_with_both_streams_actor_and_critic_and_parks_the_rest_on_disk(base, data, tmp_path):
    """ppo (a critic with its own AdamW) with both fields: the moments of both optimizers stay in their files while the
    trainer is parked on disk and back; the run equals the plain ppo run bit for bit."""
    both = {**STREAM, "offload_train": True, "offload_train_target": "disk"}
    runs = []
    for name, over in (("plain", {}), ("both", both)):
        t = _trainer(base, tmp_path / name, advantage_estimator="ppo", **over)
        metrics = []
        for i in range(2):
            metrics += _train(t, data, [i])
            if over:
                t.engine.offload()
                assert t.engine.where().disk_bytes > 0
                t.engine.onload()
        runs.append((metrics, _flat(t), torch.cat([p.detach().flatten() for p in t.engine.critic.module.parameters()])))
    moments = t.engine.moments
    assert moments["critic"].dir.name == "critic" and moments["critic"].disk_bytes() > 0 < moments["actor"].disk_bytes()
    (m0, a0, c0), (m1, a1, c1) = runs
    assert m0 == m1 and torch.equal(a0, a1) and torch.equal(c0, c1)

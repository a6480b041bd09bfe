"""CheckpointWriter (async_save): a background write saves what the model, optimizer and RNG were when it was asked
for, with the same atomic protocol and verified checksums; its error surfaces at the next wait or write."""

from __future__ import annotations

import pytest
import torch

from miles_core.checkpoint import find_latest, load_checkpoint
from miles_core.checkpoint.writer import CheckpointWriter, Write
from miles_core.finite import NonFiniteTraining


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("background", [False, True])
def test_a_write_saves_the_state_at_the_call_even_if_training_goes_on(tmp_path, make_model, train_steps, background):
    model = make_model(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_steps(model, opt, 2)
    want, want_opt = _params(model), {k: v.clone() for k, v in opt.state[next(iter(opt.state))].items()}
    torch.manual_seed(123)
    writer = CheckpointWriter(background)
    writer.write([Write(tmp_path, 0, {"model": model, "optimizer": opt, "state": {"steps_done": 2}})])
    next_draw = torch.rand(4)  # what the RNG gives right after the save was asked for
    train_steps(model, opt, 2)  # training goes on while (background) the checkpoint is written
    writer.wait()
    info = find_latest(tmp_path)
    assert info is not None and info.rollout_id == 0 and info.verified  # complete, latest moved, checksums checked
    fresh = make_model(seed=9)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    meta = load_checkpoint(info, model=fresh, optimizer=fresh_opt)
    assert meta["steps_done"] == 2
    got = _params(fresh)
    assert all(torch.equal(got[k], want[k]) for k in want)
    state = fresh_opt.state[next(iter(fresh_opt.state))]
    assert all(torch.equal(state[k], v) for k, v in want_opt.items())
    assert torch.equal(torch.rand(4), next_draw)  # the RNG state of the moment of the call


def test_a_failed_background_write_raises_at_the_next_wait_and_leaves_no_checkpoint(tmp_path, make_model):
    model = make_model(seed=0)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")  # never a checkpoint of non-finite weights
    writer = CheckpointWriter(True)
    writer.write([Write(tmp_path, 0, {"model": model, "state": {}})])
    with pytest.raises(NonFiniteTraining, match="refusing to write non-finite weights"):
        writer.wait()
    assert find_latest(tmp_path) is None and not list(tmp_path.glob(".tmp-*"))
    writer.wait()  # the error is raised once

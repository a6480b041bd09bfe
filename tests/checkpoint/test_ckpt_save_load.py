"""save_checkpoint / load_checkpoint / find_latest on the happy path: exact resume, pointer, retention."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors import safe_open

from miles_core.checkpoint import (
    CheckpointError,
    find_latest,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from miles_core.checkpoint import _fs

STATE = {"data_source": {"cursor": 17, "epoch": 0}, "weight_version": 3, "mlflow_run_id": "abc", "config_hash": "f00"}


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_params_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_resume_is_bitwise_identical_to_uninterrupted_run(tmp_path, make_model, train_steps):
    # Uninterrupted: 2 steps, checkpoint, 2 more steps.
    model = make_model(seed=0).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_steps(model, opt, 2)
    info = save_checkpoint(tmp_path, 2, model=model, optimizer=opt, state=STATE)
    train_steps(model, opt, 2)
    expected = _params(model)

    # Resumed: a differently initialised model + fresh optimizer, load, the same 2 steps.
    torch.manual_seed(999)  # RNG elsewhere: the restore must bring it back
    resumed = make_model(seed=1).train()
    opt2 = torch.optim.AdamW(resumed.parameters(), lr=1e-2)
    meta = load_checkpoint(info, model=resumed, optimizer=opt2)
    train_steps(resumed, opt2, 2)

    _assert_params_equal(_params(resumed), expected)
    assert {k: meta[k] for k in STATE} == STATE
    assert meta["rollout_id"] == 2 and meta["format_version"] == 1 and meta["created_at"]
    assert meta["contents"] == {"optimizer": True, "extra": [], "extra_optimizers": []}


def test_layout_and_tied_embeddings_stored_once(tmp_path, make_model):
    model = make_model(tie=True)
    info = save_checkpoint(tmp_path, 0, model=model, optimizer=torch.optim.AdamW(model.parameters()), state={})
    files = {p.relative_to(info.path).as_posix() for p in info.path.rglob("*") if p.is_file()}
    assert files == {".complete", "meta.json", "model/model.safetensors", "model/config.json", "optimizer.pt", "rng.pt"}
    with safe_open(info.path / "model/model.safetensors", "pt") as f:
        assert "model.embed_tokens.weight" in f.keys() and "lm_head.weight" not in f.keys()
        assert json.loads(f.metadata()["miles.aliases"]) == {"lm_head.weight": "model.embed_tokens.weight"}
    assert json.loads((info.path / "model/config.json").read_text())["tie_word_embeddings"] is True

    fresh = make_model(seed=5, tie=True)
    load_checkpoint(info, model=fresh)
    assert fresh.lm_head.weight is fresh.model.embed_tokens.weight  # still tied after the load
    _assert_params_equal(_params(fresh), _params(model))


def test_untied_model_roundtrip(tmp_path, make_model):
    model = make_model(tie=False)
    info = save_checkpoint(tmp_path, 0, model=model, state={})
    fresh = make_model(seed=5, tie=False)
    load_checkpoint(info, model=fresh)
    _assert_params_equal(_params(fresh), _params(model))


def test_latest_pointer_and_listing(tmp_path, make_model):
    model = make_model()
    assert find_latest(tmp_path / "missing") is None and list_checkpoints(tmp_path / "missing") == []
    for rid in (0, 1, 2):
        save_checkpoint(tmp_path, rid, model=model, state={"i": rid})
        assert (tmp_path / "latest").read_text().strip() == str(rid)
    assert [i.rollout_id for i in list_checkpoints(tmp_path)] == [0, 1, 2]
    latest = find_latest(tmp_path)
    assert latest.rollout_id == 2 and latest.path == tmp_path / "2" and latest.meta["i"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp leftovers


def test_retention_keeps_last_n_and_never_newer_ids(tmp_path, make_model):
    model = make_model()
    for rid in range(5):
        save_checkpoint(tmp_path, rid, model=model, state={}, keep_last=2)
    assert [i.rollout_id for i in list_checkpoints(tmp_path)] == [3, 4]
    save_checkpoint(tmp_path, 10, model=model, state={})
    save_checkpoint(tmp_path, 7, model=model, state={}, keep_last=1)  # 3, 4 go; 10 is newer: kept
    assert [i.rollout_id for i in list_checkpoints(tmp_path)] == [7, 10]
    assert find_latest(tmp_path).rollout_id == 7  # the pointer names the last save
    assert sorted(p.name for p in tmp_path.iterdir()) == ["10", "7", "latest"]


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_resave_same_id_replaces_it(tmp_path, make_model, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(_fs, "_exchange", lambda src, dst: False)
    save_checkpoint(tmp_path, 4, model=make_model(seed=0), state={"v": "old"})
    new_model = make_model(seed=1)
    save_checkpoint(tmp_path, 4, model=new_model, state={"v": "new"}, save_optim=False)
    (info,) = list_checkpoints(tmp_path)
    assert info.meta["v"] == "new"
    fresh = make_model(seed=2)
    load_checkpoint(info, model=fresh)
    _assert_params_equal(_params(fresh), _params(new_model))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["4", "latest"]


def test_extra_modules_and_no_optimizer(tmp_path, make_model, caplog):
    model = make_model()
    critic = torch.nn.Linear(64, 1)
    info = save_checkpoint(
        tmp_path, 1, model=model, optimizer=torch.optim.AdamW(model.parameters()), state={},
        save_optim=False, extra_tensors={"critic": critic},
    )  # fmt: skip
    assert (info.path / "extra/critic.safetensors").is_file() and not (info.path / "optimizer.pt").exists()
    fresh_critic = torch.nn.Linear(64, 1)
    opt = torch.optim.AdamW(model.parameters())
    with caplog.at_level(logging.WARNING):
        load_checkpoint(info, model=model, optimizer=opt, extra_modules={"critic": fresh_critic})
    assert "no optimizer.pt" in caplog.text and not opt.state  # fresh optimizer state, reported
    assert torch.equal(fresh_critic.weight, critic.weight) and torch.equal(fresh_critic.bias, critic.bias)
    with pytest.raises(CheckpointError, match="value_head"):
        load_checkpoint(info, model=model, extra_modules={"value_head": torch.nn.Linear(64, 1)})


def _stepped_adamw(module: torch.nn.Module) -> torch.optim.AdamW:
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
    module(torch.randn(3, module.in_features)).sum().backward()
    opt.step()
    return opt


def test_extra_optimizers_are_saved_with_their_modules_and_restored(tmp_path, make_model, caplog):
    model, critic = make_model(), torch.nn.Linear(64, 1)
    critic_opt = _stepped_adamw(critic)
    info = save_checkpoint(tmp_path, 2, model=model, state={}, extra_tensors={"critic": critic},
                           extra_optimizers={"critic": critic_opt})
    assert info.meta["contents"] == {"optimizer": False, "extra": ["critic"], "extra_optimizers": ["critic"]}
    assert (info.path / "extra/critic.optimizer.pt").is_file()
    fresh = torch.nn.Linear(64, 1)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    load_checkpoint(info, model=model, extra_modules={"critic": fresh}, extra_optimizers={"critic": fresh_opt})
    want, got = critic_opt.state_dict(), fresh_opt.state_dict()
    assert want["param_groups"] == got["param_groups"]
    for k, state in want["state"].items():
        assert all(torch.equal(v, got["state"][k][name]) for name, v in state.items())
    (info.path / "extra/critic.optimizer.pt").unlink()  # a checkpoint missing a file it lists is incomplete
    assert list_checkpoints(tmp_path) == []

    no_optim = save_checkpoint(tmp_path, 3, model=model, state={}, save_optim=False, extra_tensors={"critic": critic},
                               extra_optimizers={"critic": critic_opt})  # save_optim=False skips them too
    assert no_optim.meta["contents"]["extra_optimizers"] == [] and not (no_optim.path / "extra/critic.optimizer.pt").exists()
    skipped = torch.optim.AdamW(fresh.parameters())
    with caplog.at_level(logging.WARNING):
        load_checkpoint(no_optim, model=model, extra_modules={"critic": fresh}, extra_optimizers={"critic": skipped})
    assert "no extra/critic.optimizer.pt" in caplog.text and not skipped.state


def test_load_is_strict_and_names_the_file(tmp_path, make_model):
    info = save_checkpoint(tmp_path, 0, model=make_model(tie=True), state={})
    with pytest.raises(CheckpointError, match=r"model\.safetensors: does not match Linear"):
        load_checkpoint(info, model=torch.nn.Linear(2, 2), restore_rng=False)
    # A tied checkpoint fits an untied model (both keys get the shared values) ...
    load_checkpoint(info, model=make_model(tie=False), restore_rng=False)
    # ... but an untied checkpoint must not be squeezed into a tied model: one copy would be lost.
    untied = save_checkpoint(tmp_path, 1, model=make_model(tie=False), state={})
    with pytest.raises(CheckpointError, match=r"model\.safetensors: Qwen2ForCausalLM ties 'lm_head.weight'"):
        load_checkpoint(untied, model=make_model(tie=True), restore_rng=False)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"state": {"bad": object()}}, "JSON-serialisable"),
        ({"state": {"format_version": 9}}, "reserved"),
        ({"state": {}, "rollout_id": -1}, "non-negative"),
        ({"state": {}, "keep_last": 0}, "keep_last"),
        ({"state": {}, "extra_tensors": {"../x": torch.nn.Linear(1, 1)}}, "extra_tensors names"),
        ({"state": {}, "extra_optimizers": {"a/b": torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=1.0)}},
         "extra_optimizers names"),
    ],
)
def test_bad_requests_fail_before_writing(tmp_path, make_model, kwargs, match):
    kwargs = {"rollout_id": 0, **kwargs}
    with pytest.raises(CheckpointError, match=match):
        save_checkpoint(tmp_path / "ck", kwargs.pop("rollout_id"), model=make_model(), **kwargs)
    assert not (tmp_path / "ck").exists()


def test_state_may_repeat_its_own_rollout_id(tmp_path, make_model):
    info = save_checkpoint(tmp_path, 3, model=make_model(), state={"rollout_id": 3})
    assert info.meta["rollout_id"] == 3


def test_tensors_sharing_one_buffer_are_saved_separately(tmp_path):
    from miles_core.checkpoint._tensors import load_state_dict_file, save_state_dict

    fused = torch.arange(6.0)
    state = {"q": fused[:2], "k": fused[2:4], "same_q": fused[:2]}  # two disjoint views + one alias
    save_state_dict(state, tmp_path / "x.safetensors")
    loaded = load_state_dict_file(tmp_path / "x.safetensors")
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[k], state[k]) for k in state)
    assert loaded["same_q"] is loaded["q"]

"""A broken HF checkpoint is refused before any weight is read, by every loader, naming the tensor and the
config.json field: a missing, extra, mis-shaped, non-float tensor, a wrong layer count, a truncated file."""

from __future__ import annotations

import time

import pytest
import torch
from safetensors.torch import load_file

from miles_core.checkpoint import CheckpointError
from miles_core.checkpoint.hf_load import check_hf_weights, load_hf_model, load_hf_state

from ._corruptions import CASES, K_PROJ, assert_named, edit_tensors, tiny_qwen3


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return tiny_qwen3(tmp_path_factory.mktemp("hf") / "good")


@pytest.fixture(scope="module", params=sorted(CASES))
def broken(request, good, tmp_path_factory):
    make, expected = CASES[request.param]
    path = tmp_path_factory.mktemp("broken") / request.param
    make(good, path)
    return path, expected


def test_the_good_checkpoint_loads_exactly(good):
    state = load_hf_state(good)
    stored = load_file(good / "model.safetensors")
    assert set(state) == set(stored) and all(torch.equal(state[k], stored[k]) for k in stored)


def test_each_corruption_is_named_from_the_headers(broken):
    path, expected = broken
    start = time.process_time()  # CPU seconds: the work done, whatever the machine's load
    with pytest.raises(CheckpointError) as e:
        check_hf_weights(path)
    assert_named(str(e.value), expected)
    assert time.process_time() - start < 5


def test_the_torch_loaders_refuse_it(broken):
    """load_hf_model is what the torch trainer, its reference and teacher, the eval and HTTP engines call."""
    path, expected = broken
    with pytest.raises(CheckpointError) as e:
        load_hf_model(path, torch.float32)
    assert_named(str(e.value), expected)


def test_miles_convert_refuses_it(broken, tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    path, expected = broken
    start = time.process_time()  # CPU seconds: the work done, whatever the machine's load
    out = CliRunner().invoke(app, ["convert", "hf-to-torch-dist", str(path), str(tmp_path / "td")])
    assert out.exit_code == 1, out.output
    assert_named(out.output, expected)
    assert time.process_time() - start < 5 and not (tmp_path / "td").exists()


def test_hub_form_moe_checkpoints_are_checked_too(tmp_path):
    """A qwen3-moe checkpoint in the hub's per-expert form: one expert's tensor deleted is named."""
    import transformers

    config = transformers.Qwen3MoeConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=8, vocab_size=64, moe_intermediate_size=16,
                                         num_experts=4, num_experts_per_tok=2)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "good")
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in load_file(tmp_path / "good" / "model.safetensors")
    check_hf_weights(tmp_path / "good")
    edit_tensors(tmp_path / "good", tmp_path / "bad", lambda t: t.pop("model.layers.1.mlp.experts.3.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"experts\.3\.up_proj\.weight: missing \(config.json hidden_size, num_experts"):
        check_hf_weights(tmp_path / "bad")


def test_a_pytorch_bin_checkpoint_is_checked_by_the_load_report(good, tmp_path):
    """A pytorch_model.bin has no header to read: transformers' load report is the check, and a tensor it would have
    initialised fresh (k_proj deleted) or dropped (an extra one) is an error naming it, never a weight."""
    import shutil

    state = load_file(good / "model.safetensors")
    edits = {"missing": lambda s: s.pop(K_PROJ), "extra": lambda s: s.update({"model.layers.0.mlp.extra.weight": torch.zeros(2)})}
    for name, edit in edits.items():
        path = tmp_path / name
        shutil.copytree(good, path)
        (path / "model.safetensors").unlink()
        edited = dict(state)
        edit(edited)
        torch.save(edited, path / "pytorch_model.bin")
        assert check_hf_weights(path) is None  # nothing to read before loading
        with pytest.raises(CheckpointError, match="load report is not clean") as e:
            load_hf_model(path, torch.float32)
        assert (K_PROJ if name == "missing" else "model.layers.0.mlp.extra.weight") in str(e.value)
    shutil.copytree(good, tmp_path / "ok")
    (tmp_path / "ok" / "model.safetensors").unlink()
    torch.save(state, tmp_path / "ok" / "pytorch_model.bin")
    loaded = load_hf_state(tmp_path / "ok")
    assert all(torch.equal(loaded[k], state[k]) for k in state)

"""HF -> torch_dist -> HF is bit-exact, through the `miles convert` command; a torch_dist checkpoint that does
not fit the given config.json is refused naming the field."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from flows.cli import app

from .conftest import hf_state, tiny_hf


def _convert(*args: str):
    return CliRunner().invoke(app, ["convert", *args])


def test_round_trip_through_the_cli_is_bit_exact(megatron_world, tmp_path):
    hf = tiny_hf("glm4_moe")
    hf.save_pretrained(tmp_path / "hf")
    out = _convert("hf-to-torch-dist", str(tmp_path / "hf"), str(tmp_path / "td"))
    assert out.exit_code == 0, out.output
    assert (tmp_path / "td" / ".complete").is_file() and (tmp_path / "td" / "torch_dist").is_dir()
    out = _convert("torch-dist-to-hf", str(tmp_path / "td"), str(tmp_path / "back"))
    assert out.exit_code == 0, out.output
    back, sd = load_file(tmp_path / "back" / "model.safetensors"), hf_state(hf)
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)
    assert json.loads((tmp_path / "back" / "config.json").read_text())["model_type"] == "glm4_moe"


def test_a_config_that_does_not_fit_is_named(megatron_world, tmp_path):
    tiny_hf("qwen3").save_pretrained(tmp_path / "hf")
    assert _convert("hf-to-torch-dist", str(tmp_path / "hf"), str(tmp_path / "td")).exit_code == 0
    other = {**json.loads((tmp_path / "hf" / "config.json").read_text()), "num_hidden_layers": 3}
    (tmp_path / "other.json").write_text(json.dumps(other))
    out = _convert("torch-dist-to-hf", str(tmp_path / "td"), str(tmp_path / "back"), "--config", str(tmp_path / "other.json"))
    assert out.exit_code == 1 and "num_layers 2 (this model: 3)" in " ".join(out.output.split())
    assert not (tmp_path / "back").exists()
    bad = _convert("hf-to-torch-dist", str(tmp_path / "hf"))
    assert bad.exit_code == 2 and "takes SOURCE OUT" in bad.output

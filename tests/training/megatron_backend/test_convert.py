"""HF -> torch_dist -> HF is bit-exact, through the `miles convert` command; a torch_dist checkpoint that does
not fit the given config.json is refused naming the field."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from flows.cli import app

from .conftest import hf_state, tiny_hf

sys.path.insert(0, str(Path(__file__).parents[2] / "checkpoint"))  # the corruption cases shared with the loaders' tests
from _corruptions import CASES, assert_named, tiny_qwen3  # noqa: E402

DATA = Path(__file__).parent / "data"


def _convert(*args: str):
    return CliRunner().invoke(app, ["convert", *args])


@pytest.mark.parametrize("kind", ["glm4_moe", "qwen3_moe"])
def test_round_trip_through_the_cli_is_bit_exact_in_hub_format(megatron_world, tmp_path, kind):
    """HF -> torch_dist -> HF: the export holds the hub's per-expert tensor names (test data: the families' hub
    naming), passes the loaders' header check and loads back with transformers (clean load report), bit-exact."""
    from miles_core.checkpoint.hf_load import check_hf_weights, load_hf_state

    hf = tiny_hf(kind)
    hf.save_pretrained(tmp_path / "hf")
    out = _convert("hf-to-torch-dist", str(tmp_path / "hf"), str(tmp_path / "td"))
    assert out.exit_code == 0, out.output
    assert (tmp_path / "td" / ".complete").is_file() and (tmp_path / "td" / "torch_dist").is_dir()
    out = _convert("torch-dist-to-hf", str(tmp_path / "td"), str(tmp_path / "back"))
    assert out.exit_code == 0, out.output
    names = set((DATA / "hub_names" / f"{kind}.txt").read_text().split())
    assert set(load_file(tmp_path / "back" / "model.safetensors")) == names
    check_hf_weights(tmp_path / "back")
    back, sd = load_hf_state(tmp_path / "back"), hf_state(hf)
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)
    assert json.loads((tmp_path / "back" / "config.json").read_text())["model_type"] == kind


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


def test_a_megatron_lm_checkpoint_is_named_as_such(tmp_path):
    """Megatron-LM's layout (iter_<N>/ with torch_dist shards; latest_checkpointed_iteration.txt above) is refused
    saying what it is and what to do, by miles convert and by a trainer's --load (never a silent fresh start)."""
    from miles_core.training.megatron import checkpoint

    run = tmp_path / "megatron_lm"
    (run / "iter_0000001").mkdir(parents=True)
    (run / "iter_0000001" / ".metadata").write_bytes(b"")
    (run / "latest_checkpointed_iteration.txt").write_text("1")
    out = _convert("torch-dist-to-hf", str(run / "iter_0000001"), str(tmp_path / "back"))
    assert out.exit_code == 1
    said = " ".join(out.output.split())
    assert "is a Megatron-LM checkpoint" in said and "miles convert hf-to-torch-dist HF_DIR OUT" in said
    assert "interrupted write" not in said
    with pytest.raises(ValueError, match="is a Megatron-LM checkpoint"):
        checkpoint.restore(None, run)
    (tmp_path / "half").mkdir()
    out = _convert("torch-dist-to-hf", str(tmp_path / "half"), str(tmp_path / "back"))
    assert out.exit_code == 1 and "If its write was interrupted, write it again" in " ".join(out.output.split())


def test_expert_parallelism_on_a_dense_model_says_so():
    from miles_core.config.parallel import ParallelConfig
    from miles_core.config.rules import check_model_divides
    from miles_core.models.shape import ModelShape

    dense = ModelShape(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, num_experts=0)
    with pytest.raises(ValueError, match=r"dense .*set expert_model_parallel_size to 1") as e:
        check_model_divides(dense, ParallelConfig(expert_model_parallel_size=2), "hf/config.json")
    assert "divides 0" not in str(e.value)


@pytest.fixture(scope="module")
def good_qwen3(tmp_path_factory):
    return tiny_qwen3(tmp_path_factory.mktemp("hf") / "good")


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("backend", ["torch", "megatron"])
def test_both_trainers_refuse_each_corrupted_checkpoint_in_seconds(megatron_world, tmp_path, good_qwen3, cfg, tiny_tokenizer,
                                                                   backend, case):
    """The trainers' builders (train_backend torch / megatron: what miles train, eval and the engines load through) refuse
    each corruption of issue 29's first finding (missing, extra, mis-shaped, non-float tensor, a layer more or less in
    config.json, a truncated file) naming the tensor and its config.json field, in under 5 s, never filling a fresh init.
    The same cases for check_hf_weights, load_hf_model and miles convert: tests/checkpoint/test_hf_load.py."""
    from miles_core.training.backends import TRAINERS
    from miles_core.training.protocol import TrainerContext

    make, expected = CASES[case]
    make(good_qwen3, tmp_path / case)
    start = time.process_time()  # CPU seconds: the work done, whatever the machine's load
    with pytest.raises(ValueError) as e:
        TRAINERS[backend](TrainerContext(cfg=cfg(), model_path=tmp_path / case, tokenizer=tiny_tokenizer))
    assert time.process_time() - start < 5
    assert_named(str(e.value), expected)

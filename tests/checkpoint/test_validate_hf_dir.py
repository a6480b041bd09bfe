"""validate_hf_dir: summary of a good dir; every failure names the file and the field."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from miles_core.checkpoint import CheckpointError, export_hf, validate_hf_dir


@pytest.fixture
def exported(tmp_path, make_model, tokenizer):
    model = make_model()
    return export_hf(model, tokenizer, tmp_path / "exp", 0, max_shard_size=100_000), model


def test_summary_of_sharded_export(exported):
    out, model = exported
    summary = validate_hf_dir(out)
    # parameters() yields the tied embedding once, like the stored tensors
    assert summary["num_params"] == sum(p.numel() for p in model.parameters())
    assert summary["total_size"] == 4 * summary["num_params"]  # fp32
    assert {k: summary[k] for k in ("model_type", "dtype", "tie_word_embeddings", "weight_format")} == {
        "model_type": "qwen2", "dtype": "float32", "tie_word_embeddings": True, "weight_format": "safetensors-index",
    }  # fmt: skip
    assert len(summary["weight_files"]) > 1 and summary["tokenizer_files"] == ["tokenizer.json"]


def test_single_file_and_pytorch_bin_are_accepted(tmp_path, make_model, tokenizer):
    model = make_model(tie=False)
    model.save_pretrained(tmp_path / "st")  # HF writes a single model.safetensors
    tokenizer.save_pretrained(tmp_path / "st")
    summary = validate_hf_dir(tmp_path / "st")
    assert summary["weight_format"] == "safetensors" and summary["tie_word_embeddings"] is False
    assert summary["num_params"] == sum(p.numel() for p in model.parameters())

    shutil.copytree(tmp_path / "st", tmp_path / "bin")
    (tmp_path / "bin/model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "bin/pytorch_model.bin")
    summary = validate_hf_dir(tmp_path / "bin")
    assert summary["weight_format"] == "pytorch_bin" and summary["num_params"] is None


def _edit_config(**changes):
    def edit(d):
        config = json.loads((d / "config.json").read_text())
        config.update(changes)
        (d / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))

    return edit


def _first_shard(d):
    return sorted(d.glob("model-*.safetensors"))[0]


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda d: (d / "config.json").unlink(), r"config\.json: missing"),
        (lambda d: (d / "config.json").write_text("{oops"), r"config\.json: not valid JSON"),
        (lambda d: (d / "config.json").write_text("[]"), r"config\.json: expected a JSON object"),
        (_edit_config(model_type=None), r"config\.json: missing or empty field 'model_type'"),
        (_edit_config(hidden_size=None), r"config\.json: missing field 'hidden_size'"),
        (_edit_config(num_hidden_layers=0), r"config\.json: field 'num_hidden_layers' must be a positive int"),
        (_edit_config(vocab_size="256"), r"config\.json: field 'vocab_size' must be a positive int"),
        (lambda d: _first_shard(d).unlink(), r"model-00001-of-\d+\.safetensors: shard named in the index is missing"),
        (lambda d: _first_shard(d).write_bytes(b"\xff" * 16), r"model-00001-of-\d+\.safetensors: not a safetensors"),
        (lambda d: (d / "model.safetensors.index.json").write_text("{}"), r"index\.json: unreadable .*'weight_map'"),
        (lambda d: (d / "model.safetensors.index.json").unlink(), r"no weights \(expected model\.safetensors"),
        (lambda d: (d / "tokenizer.json").unlink(), r"no tokenizer file \(expected one of"),
    ],
    ids=["no-config", "bad-json", "not-object", "no-model-type", "no-hidden", "zero-layers", "str-vocab",
         "missing-shard", "bad-shard", "bad-index", "no-weights", "no-tokenizer"],  # fmt: skip
)
def test_errors_name_file_and_field(exported, damage, match):
    out, _ = exported
    damage(out)
    with pytest.raises(CheckpointError, match=match):
        validate_hf_dir(out)


def test_index_naming_absent_tensor_and_missing_dir(exported, tmp_path):
    out, _ = exported
    index = json.loads((out / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.ghost.weight"] = "model-00001-of-%05d.safetensors" % len(list(out.glob("model-*")))
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="model.ghost.weight"):
        validate_hf_dir(out)
    with pytest.raises(CheckpointError, match="not a directory"):
        validate_hf_dir(tmp_path / "nope")
    assert issubclass(CheckpointError, ValueError)

"""export_hf: HF layout, shards + index, exact reload with from_pretrained, `.complete` last."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from miles_core.checkpoint import export_hf, is_complete_export, list_exports
from miles_core.checkpoint.export import plan_shards
from miles_core.checkpoint.validate import read_safetensors_header

PROMPT = "the answer is"


def _headers(d) -> dict[str, dict]:
    return {p.name: read_safetensors_header(p) for p in sorted(d.glob("model-*.safetensors"))}


def test_files_index_and_single_shard(tmp_path, make_model, tokenizer):
    out = export_hf(make_model(), tokenizer, tmp_path, 5)
    assert out == tmp_path / "5"
    names = {p.name for p in out.iterdir()}
    assert {"model-00001-of-00001.safetensors", "model.safetensors.index.json", "config.json",
            "generation_config.json", "tokenizer.json", "tokenizer_config.json", ".complete"} <= names  # fmt: skip
    index = json.loads((out / "model.safetensors.index.json").read_text())
    (header,) = _headers(out).values()
    # total_size = bytes of tensor data = sum(numel * 4) for fp32
    assert index["metadata"]["total_size"] == sum(h["data_offsets"][1] - h["data_offsets"][0] for h in header.values())
    assert set(index["weight_map"]) == set(header)
    assert "lm_head.weight" not in index["weight_map"]  # tied: stored once, as embed_tokens
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["dtype"] == "float32"


def test_small_max_shard_size_gives_many_shards(tmp_path, make_model, tokenizer):
    max_bytes = 40_000  # embed_tokens alone is 256*64*4 = 65,536 bytes: a shard of its own
    out = export_hf(make_model(), tokenizer, tmp_path, 0, max_shard_size=max_bytes)
    headers = _headers(out)
    n = len(headers)
    assert n > 3 and set(headers) == {f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)}
    index = json.loads((out / "model.safetensors.index.json").read_text())
    for shard, header in headers.items():
        sizes = [h["data_offsets"][1] - h["data_offsets"][0] for h in header.values()]
        assert sum(sizes) <= max_bytes or len(sizes) == 1
        assert all(index["weight_map"][name] == shard for name in header)
    assert index["metadata"]["total_size"] == sum(
        h["data_offsets"][1] - h["data_offsets"][0] for header in headers.values() for h in header.values()
    )


def test_plan_shards_is_greedy_and_order_preserving():
    assert plan_shards({"a": 6, "b": 5, "c": 4, "d": 20, "e": 1}, 10) == [["a"], ["b", "c"], ["d"], ["e"]]


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_from_pretrained_gives_identical_logits_and_generation(tmp_path, make_model, tokenizer, tie):
    model = make_model(tie=tie)
    out = export_hf(model, tokenizer, tmp_path, 1, max_shard_size=100_000)
    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok(PROMPT, return_tensors="pt").input_ids
    assert ids.tolist() == tokenizer(PROMPT, return_tensors="pt").input_ids.tolist()
    assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) is tie
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    kwargs = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": tok.pad_token_id}
    assert torch.equal(loaded.generate(ids, **kwargs), model.generate(ids, **kwargs))


def test_bf16_model_exports_and_loads_as_bf16(tmp_path, make_model, tokenizer):
    model = make_model().to(torch.bfloat16)
    loaded = AutoModelForCausalLM.from_pretrained(export_hf(model, tokenizer, tmp_path, 0))
    assert loaded.dtype == torch.bfloat16
    assert torch.equal(loaded.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_complete_marker_is_written_last(tmp_path, make_model, tokenizer):
    out = export_hf(make_model(), tokenizer, tmp_path, 2)
    marker = out / ".complete"
    others = [p for p in out.iterdir() if p.name != ".complete"]
    assert all(p.stat().st_mtime_ns <= marker.stat().st_mtime_ns for p in others)
    assert set(json.loads(marker.read_text())["files"]) == {p.name for p in others}  # manifest of everything
    assert is_complete_export(out)


class _FailingTokenizer:
    """Writes one file, then the disk is full."""

    def save_pretrained(self, path):
        (path / "tokenizer.json").write_text("{")
        raise OSError(28, "No space left on device")


def test_failure_mid_export_leaves_no_marker_and_no_temp(tmp_path, make_model, tokenizer, caplog):
    export_hf(make_model(), tokenizer, tmp_path, 1)
    with pytest.raises(OSError):
        export_hf(make_model(), _FailingTokenizer(), tmp_path, 2)
    assert not (tmp_path / "2").exists()
    # Re-export of an existing id: the stale marker goes first, so a failure leaves it incomplete.
    with pytest.raises(OSError):
        export_hf(make_model(), _FailingTokenizer(), tmp_path, 1)
    assert not is_complete_export(tmp_path / "1") and (tmp_path / "1/config.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1"]  # no .tmp-* left
    with caplog.at_level(logging.WARNING):
        assert list_exports(tmp_path) == []
    assert f"skipping HF export {tmp_path / '1'}: no .complete marker" in caplog.text


def test_reexport_replaces_and_list_exports(tmp_path, make_model, tokenizer):
    for rid in (3, 1):
        export_hf(make_model(seed=0), tokenizer, tmp_path, rid)
    new = make_model(seed=1)
    export_hf(new, tokenizer, tmp_path, 3)
    assert list_exports(tmp_path) == [(1, tmp_path / "1"), (3, tmp_path / "3")]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "3")
    expected = new.state_dict()
    assert all(torch.equal(t, expected[k]) for k, t in loaded.state_dict().items())
    assert not is_complete_export(tmp_path / "missing")

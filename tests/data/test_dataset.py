"""Prompt data: jsonl/parquet, slices, keys, over-long prompts dropped, errors naming file and row."""

from __future__ import annotations

import json

import pytest

from miles_core.data import DataError, DataSource, PromptSpec, load_prompts, read_rows, split_slice


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_slice_spec():
    assert split_slice("a/b.jsonl@[2:5]")[1] == slice(2, 5)
    assert split_slice("a/b.jsonl@[:-1]")[1] == slice(None, -1)
    assert split_slice("a/b.jsonl")[1] == slice(None)


def test_jsonl_and_parquet_read_the_same(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"input": f"{i}+1=", "label": str(i + 1)} for i in range(6)]
    _jsonl(tmp_path / "d.jsonl", rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    assert read_rows(str(tmp_path / "d.jsonl@[1:4]")) == rows[1:4]
    assert read_rows(str(tmp_path / "d.parquet@[1:4]")) == rows[1:4]


def test_missing_file_named(tmp_path):
    with pytest.raises(DataError, match="not found: .*nope.jsonl"):
        read_rows(str(tmp_path / "nope.jsonl"))


def test_malformed_line_named(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"input": "a"}\n{"input": \n')
    with pytest.raises(DataError, match=r"d.jsonl:2: malformed JSON"):
        read_rows(str(p))


def test_row_without_input_key_named(tmp_path, tiny_tokenizer):
    p = _jsonl(tmp_path / "d.jsonl", [{"input": "1+1=", "label": "2"}, {"question": "x", "label": "1"}])
    with pytest.raises(DataError, match=r"d.jsonl:2: row has no input key 'input'"):  # the 1-based line
        load_prompts(str(p), tiny_tokenizer, PromptSpec())


def test_custom_keys_metadata_and_length_filter(tmp_path, tiny_tokenizer):
    rows = [{"q": "1+1=", "a": "2", "meta": {"rm_type": "math"}}, {"q": "1+1=" * 20, "a": "x", "meta": {}}]
    p = _jsonl(tmp_path / "d.jsonl", rows)
    spec = PromptSpec(input_key="q", label_key="a", metadata_key="meta", max_prompt_len=8)
    prompts, dropped = load_prompts(str(p), tiny_tokenizer, spec)
    assert dropped == 1 and len(prompts) == 1
    assert prompts[0].label == "2" and prompts[0].metadata == {"rm_type": "math"}
    assert prompts[0].input_ids == tiny_tokenizer("1+1=")["input_ids"]


def test_chat_template_applied(tmp_path, tiny_tokenizer):
    p = _jsonl(tmp_path / "d.jsonl", [{"input": "1+1=", "label": "2"}])
    prompts, _ = load_prompts(str(p), tiny_tokenizer, PromptSpec(apply_chat_template=True))
    text = tiny_tokenizer.decode(prompts[0].input_ids)
    assert text.startswith("<|im_start|>user\n1+1=") and text.endswith("<|im_start|>assistant\n")


def test_data_source_cursor_roundtrip_and_epochs(tmp_path, tiny_tokenizer):
    p = _jsonl(tmp_path / "d.jsonl", [{"input": f"{i}+0=", "label": str(i)} for i in range(5)])
    prompts, _ = load_prompts(str(p), tiny_tokenizer, PromptSpec())
    a = DataSource(prompts, shuffle=True, seed=42)
    first = [pr.label for _, pr in a.next_prompts(3)]
    state = a.state_dict()
    rest = [(g, pr.label) for g, pr in a.next_prompts(4)]  # wraps into epoch 1
    b = DataSource(prompts, shuffle=True, seed=42)
    b.load_state_dict(state)
    assert [(g, pr.label) for g, pr in b.next_prompts(4)] == rest
    assert sorted(first + [lab for _, lab in rest[:2]]) == ["0", "1", "2", "3", "4"]  # epoch 0 is a permutation
    assert a.cursor.epoch == 1 and [g for g, _ in rest] == [3, 4, 5, 6]


def test_arith_chat_is_arith_as_chat_messages():
    from miles_core.data.tasks import BUILTIN_TASKS

    plain, chat = BUILTIN_TASKS["arith"].rows()[0], BUILTIN_TASKS["arith-chat"].rows()[0]
    assert chat["label"] == plain["label"] and chat["metadata"] == plain["metadata"]  # same questions, same seed
    msgs = chat["input"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert msgs[2]["content"] == "\\boxed{5}" and msgs[-1]["content"].replace(" ", "") == plain["input"].rstrip("=")


def test_sample_to_dict_equals_asdict_and_copies():
    from dataclasses import asdict

    from miles_core.data.sample import Sample, Status

    s = Sample(group_index=1, index=2, tokens=[1, 2, 3], response_length=1, label={"a": [1]}, reward={"score": 1.0},
               loss_mask=[1], rollout_log_probs=[-0.5], weight_versions=[3], status=Status.COMPLETED,
               metadata={"x": {"y": 1}}, prompt=[{"role": "user", "content": "hi"}])
    d = s.to_dict()
    assert d == {**asdict(s), "status": "completed"}
    assert d["metadata"]["x"] is not s.metadata["x"] and d["tokens"] is not s.tokens and d["prompt"][0] is not s.prompt[0]
    assert Sample.from_dict(d) == s

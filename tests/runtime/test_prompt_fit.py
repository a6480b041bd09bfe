"""Prompts fit the model (issue 30, finding 3): without rollout_max_context_len the context is the model's
max_position_embeddings; prompts longer than it minus rollout_max_response_len are dropped (counted, logged once),
and a dataset where none fit fails before any model loads, naming the limit."""

from __future__ import annotations

import json
import logging

import pytest

from flows.recipes import load_config
from miles_core.data.dataset import DataError
from miles_core.runtime.placement import load_run_data

LONG = " ".join(["1+1"] * 400)  # well over 256 tokens


def _data(tmp_path, rows):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"input": text, "label": "2"}) + "\n" for text in rows))
    return str(path)


def test_a_prompt_longer_than_the_model_context_is_dropped_counted_and_logged_once(tmp_path, caplog):
    cfg = load_config("tiny", {"prompt_data": _data(tmp_path, ["1+1=", LONG, "2+2="]), "eval_prompt_data": None})
    with caplog.at_level(logging.WARNING, logger="miles_core.runtime.placement"):
        data = load_run_data(cfg)
    assert data.context_len == 256  # the tiny model's max_position_embeddings
    assert (data.num_prompts, data.dropped_prompts) == (2, 1)
    lines = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert lines == ["dropped 1 of 3 prompts longer than 244 tokens (the context 256 (the model's "
                     "max_position_embeddings) minus rollout_max_response_len 12)"]


def test_a_dataset_where_no_prompt_fits_fails_naming_the_limit(tmp_path):
    cfg = load_config("tiny", {"prompt_data": _data(tmp_path, [LONG, LONG]), "eval_prompt_data": None,
                               "rollout_max_context_len": 300})
    with pytest.raises(DataError, match=r"no usable prompts \(2 rows, 2 longer than 288 tokens: the context 300 "
                                        r"\(rollout_max_context_len\) minus rollout_max_response_len 12\)"):
        load_run_data(cfg)


def test_chat_template_path_replaces_the_tokenizers_template_for_prompts_eval_and_turns(tmp_path):
    """The reference's --chat-template-path (miles/utils/processing_utils.py: load_tokenizer): the file's template renders
    the training and eval prompts and the multi-turn loop's messages; a missing file fails naming the field."""
    from miles_core.rollout.multi_turn.loop import tools_of
    from miles_core.rollout.multi_turn.spec import turn_spec

    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}{% if add_generation_prompt %} =>{% endif %}")
    data = _data(tmp_path, ["1+1="])
    base = {"prompt_data": data, "eval_prompt_data": ["e", data], "apply_chat_template": True}
    own = load_run_data(load_config("tiny", base))
    custom = load_run_data(load_config("tiny", {**base, "chat_template_path": str(template)}))
    decode = custom.tokenizer.decode
    assert decode(custom.source.prompts[0].input_ids) == "[user] 1+1= =>" != own.tokenizer.decode(own.source.prompts[0].input_ids)
    assert decode(custom.eval_suite.datasets[0].prompts[0].input_ids) == "[user] 1+1= =>"
    cfg = load_config("tiny", {**base, "chat_template_path": str(template), "custom_generate_function_path": "multi_turn",
                               "eval_prompt_data": None})
    assert tools_of(turn_spec(cfg, custom.model_path)).tokenizer.chat_template == template.read_text()
    with pytest.raises(ValueError, match="chat_template_path .*missing.jinja: no such file"):
        load_run_data(load_config("tiny", {**base, "chat_template_path": str(tmp_path / "missing.jinja")}))

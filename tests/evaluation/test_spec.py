"""Eval datasets from name path pairs and an eval config file: defaults, per-dataset overrides, and
everything unset inherited from the run (eval_* flags, then the rollout values)."""

from __future__ import annotations

import json

import pytest

from miles_core.config import ConfigError
from flows.recipes import load_config
from miles_core.evaluation.spec import read_eval_file, resolve_datasets


def _write(tmp_path, text: str):
    p = tmp_path / "eval.yaml"
    p.write_text(text)
    return str(p)


def test_pairs_inherit_eval_flags_then_rollout_values():
    cfg = load_config("tiny", {"eval_prompt_data": ["a", "p1", "b", "p2"], "eval_top_p": 0.5, "n_samples_per_eval_prompt": 4})
    a, b = resolve_datasets(cfg)
    assert (a.name, a.path, b.name, b.path) == ("a", "p1", "b", "p2")
    assert a.top_p == 0.5 and a.n_samples == 4  # eval flags
    assert a.temperature == 1.0 and a.max_response_len == 12 and a.rm_type == "math"  # rollout values of the tiny recipe
    assert a.input_key == "input" and a.label_key == "label"


def test_eval_input_and_label_keys_name_the_eval_datasets_keys(tmp_path):
    """The reference's --eval-input-key / --eval-label-key: the eval datasets' keys, instead of input_key / label_key;
    a dataset of the eval config that names its own key keeps it."""
    path = _write(tmp_path, "datasets:\n  - {name: own, path: p3, input_key: q}\n")
    pairs = {"eval_prompt_data": ["a", "p1"], "eval_config": path}
    a, own = resolve_datasets(load_config("tiny", {**pairs, "eval_input_key": "question", "eval_label_key": "answer"}))
    assert (a.input_key, a.label_key, own.input_key, own.label_key) == ("question", "answer", "q", "answer")
    a, own = resolve_datasets(load_config("tiny", pairs))
    assert (a.input_key, a.label_key, own.input_key) == ("input", "label", "q")


def test_eval_config_dataset_beats_defaults_beats_run(tmp_path):
    path = _write(tmp_path, """
eval:
  defaults:
    n_samples_per_eval_prompt: 4
    temperature: 0.6
    max_response_len: 32
  datasets:
    - name: aime
      path: /data/aime.jsonl
      rm_type: deepscaler
      prompt_key: prompt
      n_samples_per_eval_prompt: 16
      metadata_overrides: {split: test}
    - name: arith
      path: builtin://arith-test@[0:8]
""")
    cfg = load_config("tiny", {"eval_prompt_data": None, "eval_config": path, "eval_top_k": 5})
    aime, arith = resolve_datasets(cfg)
    assert (aime.n_samples, aime.temperature, aime.max_response_len) == (16, 0.6, 32)
    assert (aime.rm_type, aime.input_key, aime.metadata_overrides) == ("deepscaler", "prompt", {"split": "test"})
    assert aime.top_k == 5 and aime.top_p == 1.0  # eval flag, then the rollout value
    assert (arith.n_samples, arith.rm_type, arith.input_key) == (4, "math", "input")


def test_min_new_tokens_from_the_dataset_then_eval_min_new_tokens(tmp_path, tiny_tokenizer):
    """The reference's --eval-min-new-tokens and its EvalDatasetConfig.min_new_tokens (utils/eval_config.py), as
    SGLang's min_new_tokens on every eval request, capped by the answer budget."""
    from miles_core.evaluation.suite import build_suite

    path = _write(tmp_path, "datasets:\n  - {name: own, path: 'builtin://arith-test@[0:4]', min_new_tokens: 20, max_response_len: 6}\n")
    cfg = load_config("tiny", {"eval_config": path, "eval_min_new_tokens": 3})
    arith, own = resolve_datasets(cfg)
    assert (arith.min_new_tokens, own.min_new_tokens) == (3, 20)
    suite = build_suite(cfg, tiny_tokenizer)
    assert [d.params.min_new_tokens for d in suite.datasets] == [3, 6]  # 20 capped by own's 6-token budget
    assert resolve_datasets(load_config("tiny", {}))[0].min_new_tokens == 0


def test_mapping_form_and_pairs_together(tmp_path):
    path = _write(tmp_path, "datasets:\n  hard: {path: h.jsonl, top_p: 0.9}\n")
    names = [d.name for d in resolve_datasets(load_config("tiny", {"eval_config": path}))]
    assert names == ["arith", "hard"]  # tiny's pair first


def test_duplicate_name_and_bad_fields_are_clear_errors(tmp_path):
    dup = _write(tmp_path, "datasets: [{name: arith, path: x.jsonl}]\n")
    with pytest.raises(ConfigError, match="'arith' is defined twice"):
        resolve_datasets(load_config("tiny", {"eval_config": dup}))
    bad = _write(tmp_path, "datasets: [{name: a, path: x.jsonl, temprature: 0.5}]\n")
    with pytest.raises(ConfigError, match=r"datasets\.0\.temprature"):
        read_eval_file(bad)
    with pytest.raises(ConfigError, match="no such file"):
        read_eval_file(tmp_path / "missing.yaml")


def test_eval_max_prompt_len_drops_the_longer_eval_prompts(tmp_path, tiny_tokenizer):
    """The reference's --eval-max-prompt-len: eval prompts over it are dropped; the training prompts' limit is not used."""
    from miles_core.evaluation import build_suite

    data = tmp_path / "eval.jsonl"
    data.write_text('{"input": "1+1=", "label": "2"}\n{"input": "' + "1+" * 40 + '1=", "label": "41"}\n')
    base = {"eval_prompt_data": ["e", str(data)], "rollout_max_prompt_len": 200}
    lengths = [len(tiny_tokenizer("1+1=")["input_ids"]), len(tiny_tokenizer("1+" * 40 + "1=")["input_ids"])]
    assert lengths[0] < 20 < lengths[1] < 200
    counts = {limit: len(build_suite(load_config("tiny", {**base, "eval_max_prompt_len": limit}), tiny_tokenizer).datasets[0].prompts)
              for limit in (None, 20)}
    assert counts == {None: 2, 20: 1}


def test_eval_max_context_len_caps_each_eval_responses_budget(tmp_path, tiny_tokenizer, tiny_model):
    """The reference's --eval-max-context-len: a response's budget is what the context leaves after its prompt (at
    least 1), asked of the real engine; unset, the dataset's max response length."""
    from miles_core.evaluation import build_suite
    from miles_core.evaluation.core import generate_samples
    from miles_core.rollout.hf_engine import HFEngine

    data = tmp_path / "eval.jsonl"
    data.write_text('{"input": "1+1=", "label": "2"}\n{"input": "' + "1+" * 20 + '1=", "label": "21"}\n')
    lengths = [len(tiny_tokenizer("1+1=")["input_ids"]), len(tiny_tokenizer("1+" * 20 + "1=")["input_ids"])]
    base = {"eval_prompt_data": ["e", str(data)], "eval_max_response_len": 16, "n_samples_per_eval_prompt": 1}
    engine, asked = HFEngine(tiny_model, tiny_tokenizer), []
    generate = engine.generate
    engine.generate = lambda reqs, seed: asked.append([r.params.max_new_tokens for r in reqs]) or generate(reqs, seed=seed)
    ctx = lengths[0] + 10
    assert lengths[1] > ctx
    for limit in (None, ctx):
        (ds,) = build_suite(load_config("tiny", {**base, "eval_max_context_len": limit}), tiny_tokenizer).datasets
        samples = generate_samples(engine, ds, seed=1, decode=tiny_tokenizer.decode)
        assert all(len(s.tokens) - n <= asked[-1][i] for i, (s, n) in enumerate(zip(samples, lengths)))
    assert asked == [[16, 16], [10, 1]]  # 16 each; then the 10 tokens the context leaves, and 1 for the longer prompt


def test_eval_tool_key_names_the_eval_datasets_tool_key(tmp_path, tiny_tokenizer):
    """The reference's --eval-tool-key (miles/utils/eval_config.py: eval_tool_key, then tool_key): the eval rows' tool
    definitions, rendered by the chat template; a dataset of the eval config naming its own tool_key keeps it."""
    from miles_core.evaluation import build_suite

    data = tmp_path / "eval.jsonl"
    tools = [{"type": "function", "function": {"name": "calc", "description": "adds", "parameters": {"type": "object"}}}]
    data.write_text(json.dumps({"input": "1+1=", "label": "2", "fns": tools}) + "\n")
    own = _write(tmp_path, f"datasets:\n  - {{name: own, path: {data}, tool_key: absent}}\n")
    template = "{% for t in tools or [] %}{{ t.function.name }} {% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}"
    base = {"eval_prompt_data": ["e", str(data)], "eval_config": own, "apply_chat_template": True,
            "apply_chat_template_kwargs": {"chat_template": template}}
    ds = resolve_datasets(load_config("tiny", {**base, "eval_tool_key": "fns"}))
    assert [d.tool_key for d in ds] == ["fns", "absent"]
    assert [d.tool_key for d in resolve_datasets(load_config("tiny", base))] == [None, "absent"]

    def prompt_ids(**over):
        suite = build_suite(load_config("tiny", {**base, **over}), tiny_tokenizer)
        return [d.prompts[0].input_ids for d in suite.datasets]

    (with_tools, own_ids), (plain, own_plain) = prompt_ids(eval_tool_key="fns"), prompt_ids()
    assert tiny_tokenizer.decode(with_tools) == "calc 1+1=" and tiny_tokenizer.decode(plain) == "1+1="
    assert own_ids == own_plain == plain

"""The built-in multi-turn loop on a scripted engine (the model's turns are fixed texts, so masks,
log-probs, versions and ids are known exactly): tool output masked, token-in token-out, failures of
a tool, max turns, the length budget, an abort across turns continued by partial rollout."""

from __future__ import annotations

import asyncio
import time

import pytest

from miles_core.data.sample import Sample, Status
from miles_core.models.tiny_tools import TOOLS_CHAT_TEMPLATE
from miles_core.models.tokenizer import train_tokenizer
from miles_core.rollout.generate import RolloutSpec, generate_unfinished
from miles_core.rollout.multi_turn import TurnSpec, multi_turn_metrics, zero_failed_rewards
from miles_core.data.chat_template import render_ids
from miles_core.rollout.protocol import GenerateResult, SamplingParams
from miles_core.training.batch import make_batch

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
CALL = '<tool_call>{"name": "add", "arguments": {"a": 482, "b": 397}}</tool_call>'


def add(name, arguments):
    return str(arguments["a"] + arguments["b"])


def raises(name, arguments):
    raise RuntimeError("calculator offline")


def hangs(name, arguments):
    time.sleep(30)


async def returns_int(name, arguments):
    return 879


def tools_list():
    return TOOLS


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    corpus = [CALL, "482+397", "\\boxed{879}", "tools: add", "user assistant tool system"] * 20
    tok = train_tokenizer(corpus, vocab_size=400)
    tok.chat_template, tok.eos_token = TOOLS_CHAT_TEMPLATE, "<|im_end|>"
    path = tmp_path_factory.mktemp("tok")
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tok(tok_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tok_dir)


class ScriptedEngine:
    """Turn k of every conversation answers script[k] (ids = its encoding + <|im_end|>, log-prob of token j = -(j+1)/10);
    ``abort_turns``: turns whose first request comes back cut to 2 tokens with finish reason abort."""

    def __init__(self, tok, script, abort_turns=(), version=3):
        self.tok, self.script, self.abort_turns, self.version = tok, script, set(abort_turns), version
        self.outputs: list[list[int]] = []

    def generate(self, requests, seed):
        out = []
        for r in requests:
            turn = self.tok.decode(r.input_ids).count("<|im_start|>assistant") - 1
            ids = self.tok(self.script[min(turn, len(self.script) - 1)], add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            reason = "stop"
            done = len(self.tok.decode(r.input_ids).split("<|im_start|>assistant\n")[-1])  # text already in this turn (a continuation)
            if done:
                ids = self.tok(self.tok.decode(ids)[done:], add_special_tokens=False)["input_ids"]
            if len(ids) > r.params.max_new_tokens:
                ids, reason = ids[: r.params.max_new_tokens], "length"
            if turn in self.abort_turns and not done:
                self.abort_turns.discard(turn)
                ids, reason = ids[:2], "abort"
            self.outputs.append(ids)
            out.append(GenerateResult(output_ids=ids, output_log_probs=[-(j + 1) / 10 for j in range(len(ids))],
                                      finish_reason=reason, weight_version=self.version))
        return out


def _spec(tok_dir, execute="tests.rollout.test_multi_turn.add", max_turns=4, max_new=64, timeout=5.0) -> RolloutSpec:
    turns = TurnSpec(generate_function="multi_turn", tokenizer_path=str(tok_dir), max_turns=max_turns, tool_call_parser="qwen25",
                     tool_specs_path="tests.rollout.test_multi_turn.tools_list", execute_tool_path=execute, tool_timeout=timeout)
    return RolloutSpec(rollout_batch_size=1, n_samples_per_prompt=2, params=SamplingParams(max_new_tokens=max_new), turns=turns)


def _group(tok, n=2) -> list[list[Sample]]:
    prompt = render_ids(tok, [{"role": "user", "content": "482+397"}], tools=TOOLS, add_generation_prompt=True)
    return [[Sample(index=k, prompt="482+397", tokens=list(prompt), label="879") for k in range(n)]]


def _run(engine, tok, spec, groups=None):
    groups = groups or _group(tok)
    generate_unfinished(engine, groups, spec, seed=0, decode=lambda ids: tok.decode(ids, skip_special_tokens=True))
    return groups[0]


def test_tool_output_is_masked_and_ids_are_the_engines(tok, tok_dir):
    engine = ScriptedEngine(tok, [CALL, "\\boxed{879}"])
    s = _run(engine, tok, _spec(tok_dir))[0]
    call, answer = engine.outputs[0], engine.outputs[2]  # turn 0 of samples 0 and 1, then turn 1
    tool = s.response_tokens[len(call) : s.response_length - len(answer)]
    assert s.response_tokens == call + tool + answer  # token-in token-out: the engine's ids, then the tool ids
    assert tok.decode(tool) == "\n<|im_start|>tool\n879<|im_end|>\n<|im_start|>assistant\n"
    assert s.loss_mask == [1] * len(call) + [0] * len(tool) + [1] * len(answer)
    lp = lambda n: [-(j + 1) / 10 for j in range(n)]  # noqa: E731
    assert s.rollout_log_probs == lp(len(call)) + [0.0] * len(tool) + lp(len(answer))
    assert s.weight_versions == [3, 3] and s.status == Status.COMPLETED
    assert s.metadata["round_number"] == 2 and s.metadata["tool_calls"] == 1 and "tool_failure" not in s.metadata
    assert s.response.endswith("\\boxed{879}")
    batch = make_batch([Sample.from_dict(s.to_dict())], pad_id=tok.pad_token_id)  # what the trainer consumes, via a rollout file
    assert batch.resp_tokens[0].tolist() == call + tool + answer and batch.loss_mask[0].tolist() == s.loss_mask


def test_ids_equal_the_chat_template_where_it_is_append_only(tok, tok_dir):
    s = _run(ScriptedEngine(tok, [CALL, "\\boxed{879}"]), tok, _spec(tok_dir))[0]
    messages = [{"role": "user", "content": "482+397"}, {"role": "assistant", "content": CALL},
                {"role": "tool", "name": "add", "content": "879"}, {"role": "assistant", "content": "\\boxed{879}"}]
    full = render_ids(tok, messages, tools=TOOLS, add_generation_prompt=False)
    assert full[: len(s.tokens)] == s.tokens  # the template renders the last turn's end with one more "\n"
    assert tok.decode(full[len(s.tokens):]) == "\n"


@pytest.mark.parametrize("execute, reason, says", [
    ("raises", "error", "tool 'add' raised RuntimeError: calculator offline"),
    ("hangs", "timeout", "tool 'add' ran past generate_tool_timeout (0.3s)"),
    ("returns_int", "non_text", "tool 'add' returned int, not str"),
])
def test_a_failing_tool_ends_the_conversation_with_reward_zero(tok, tok_dir, execute, reason, says):
    engine = ScriptedEngine(tok, [CALL, "\\boxed{879}"])
    t0 = time.perf_counter()
    group = _run(engine, tok, _spec(tok_dir, execute=f"tests.rollout.test_multi_turn.{execute}", timeout=0.3))
    assert time.perf_counter() - t0 < 5  # a hung tool is left behind at its timeout
    for s in group:
        assert s.metadata["tool_failure"] == reason and s.metadata["tool_failure_message"] == says
        assert s.metadata["round_number"] == 1 and s.loss_mask == [1] * s.response_length and s.status == Status.COMPLETED
        s.reward = 1.0
    zero_failed_rewards(group, None)
    assert [s.reward for s in group] == [0.0, 0.0]
    assert multi_turn_metrics(group)[f"multi_turn/tool_failures/{reason}"] == 2.0


def test_max_turns_and_the_length_budget(tok, tok_dir):
    always_calls = ScriptedEngine(tok, [CALL])
    s = _run(always_calls, tok, _spec(tok_dir, max_turns=3, max_new=400))[0]
    assert s.metadata["round_number"] == 3 and s.metadata["tool_calls"] == 2 and s.status == Status.COMPLETED
    assert len(s.weight_versions) == 3
    tight = _run(ScriptedEngine(tok, [CALL]), tok, _spec(tok_dir, max_turns=8, max_new=40))[0]
    assert tight.response_length == 40 and tight.status == Status.TRUNCATED  # model + tool tokens share the budget
    m = multi_turn_metrics([s, tight])
    assert m["multi_turn/raw_response_length/response_length_clip_ratio"] == 0.5
    assert m["multi_turn/wo_obs_response_length/response_length_max"] == sum(s.loss_mask)
    assert m["multi_turn/multi_turn_metric/round_number_max"] == 3 and m["multi_turn/tool_call_ratio"] == 1.0


def test_an_abort_mid_conversation_is_continued_in_the_same_turn(tok, tok_dir):
    spec = _spec(tok_dir)
    clean = _run(ScriptedEngine(tok, [CALL, "\\boxed{879}"]), tok, spec)[0]
    engine = ScriptedEngine(tok, [CALL, "\\boxed{879}"], abort_turns={1})
    groups = _group(tok, n=1)
    first = _run(engine, tok, spec, groups)[0]
    assert first.status == Status.ABORTED and first.metadata["round_number"] == 1
    engine.version = 4  # a weight sync between the rounds
    again = _run(engine, tok, spec, groups)[0]
    assert again.status == Status.COMPLETED and again.tokens == clean.tokens and again.loss_mask == clean.loss_mask
    assert again.weight_versions == [3, 3, 4] and again.metadata["round_number"] == 2


def test_malformed_and_cut_calls_end_the_conversation_and_are_counted(tok, tok_dir):
    bad = _run(ScriptedEngine(tok, ['<tool_call>{"name": "add", "arguments": {"a": 4,}}</tool_call>']), tok, _spec(tok_dir))
    cut = _run(ScriptedEngine(tok, [CALL]), tok, _spec(tok_dir, max_new=10))
    assert bad[0].status == Status.COMPLETED and bad[0].metadata["round_number"] == 1
    assert multi_turn_metrics(bad)["multi_turn/tool_calls/malformed"] == 2.0
    assert cut[0].status == Status.TRUNCATED and multi_turn_metrics(cut)["multi_turn/tool_calls/incomplete"] == 0.0

"""generate_tool_call_parser: the Qwen/Hermes and GLM-4.5 formats; well-formed, malformed, several
calls in one turn, a call cut by the length limit."""

import pytest

from miles_core.rollout.multi_turn import ToolCall, get_parser


def test_qwen25_one_call_and_text():
    out = get_parser("qwen25")('Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n</tool_call>')
    assert out.calls == [ToolCall(name="add", arguments={"a": 12, "b": 30})]
    assert out.text == "Let me add.\n" and not out.malformed and not out.incomplete


def test_qwen25_several_calls_in_order_and_string_arguments():
    text = ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call> and '
            '<tool_call>{"name": "mul", "arguments": "{\\"a\\": 3}"}</tool_call><tool_call>{"name": "now"}</tool_call>')
    out = get_parser("hermes")(text)
    assert [c.name for c in out.calls] == ["add", "mul", "now"]
    assert out.calls[1].arguments == {"a": 3} and out.calls[2].arguments == {}
    assert out.text == " and "


@pytest.mark.parametrize("body, why", [
    ('{"name": "add", "arguments": {"a": 1,}}', "not JSON"),
    ('["add"]', "expected a JSON object"),
    ('{"arguments": {}}', "no 'name'"),
    ('{"name": "add", "arguments": [1, 2]}', "arguments must be an object"),
])
def test_qwen25_malformed_call_is_reported_not_run(body, why):
    out = get_parser("qwen")(f'<tool_call>{body}</tool_call><tool_call>{{"name": "ok", "arguments": {{}}}}</tool_call>')
    assert [c.name for c in out.calls] == ["ok"]  # the well-formed call after it still counts
    assert len(out.malformed) == 1 and why in out.malformed[0] and out.malformed[0].startswith("tool call 0")


def test_call_split_across_the_length_limit_is_incomplete():
    out = get_parser("qwen25")('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>then <tool_call>{"name": "add", "argu')
    assert [c.name for c in out.calls] == ["add"] and out.incomplete and out.text == "then "
    assert get_parser("glm45")("<tool_call>add\n<arg_key>a</arg_key>\n<arg_val").incomplete


def test_glm45_calls_with_json_and_string_values():
    text = ("ok<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>12</arg_value>\n<arg_key>b</arg_key>\n<arg_value>30</arg_value>\n"
            "</tool_call><tool_call>search\n<arg_key>query</arg_key>\n<arg_value>large sums</arg_value>\n</tool_call>"
            "<tool_call>now\n</tool_call>")
    out = get_parser("glm45")(text)
    assert out.calls == [ToolCall("add", {"a": 12, "b": 30}), ToolCall("search", {"query": "large sums"}), ToolCall("now", {})]
    assert out.text == "ok" and not out.malformed


def test_glm45_malformed():
    out = get_parser("glm4")("<tool_call>\n<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>"
                             "<tool_call>add\n<arg_key>a</arg_key></tool_call>")
    assert not out.calls and len(out.malformed) == 2
    assert "no function name" in out.malformed[0] and "unpaired" in out.malformed[1]


def test_unknown_parser_lists_the_valid_names():
    with pytest.raises(ValueError, match="generate_tool_call_parser 'qwen3_coder' is not known; valid: .*glm45.*qwen25"):
        get_parser("qwen3_coder")

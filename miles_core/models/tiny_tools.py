"""``builtin://tiny-qwen2-tools``: the tiny Qwen2 warmed up to use a calculator tool on the ``calc``
task (3-digit sums), for the ``tiny-tools`` recipe.

Its chat template is the tiny models' ChatML plus a one-line tool list (``tools: add``) when tools
are given, and tool messages as ``<|im_start|>tool\\n<output><|im_end|>``; a turn ends with
``<|im_end|>`` (the tokenizer's EOS here, so the engine stops there). The supervised warm-up shows
the call format in ``tool_fraction`` of the examples: the turn ``<tool_call>{"name": "add",
"arguments": {"a": .., "b": ..}}</tool_call><|im_end|>``, the tool message (not trained on), then
``\\boxed{sum}<|im_end|>``; the rest answer ``\\boxed{sum}`` at once, which the model cannot compute,
so RL has tool use to learn. The examples are built with the same ids a rollout produces (the
prompt and tool ids from the chat template, rollout/multi_turn/template.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from miles_core.data.tasks import BUILTIN_TASKS, CALC_TOOLS, calc_call_text, format_answer
from miles_core.models.builtin import GENERAL_TEXT, TinySpec, init_model, train_supervised
from miles_core.models.tokenizer import publish_model_dir, train_tokenizer

TOOLS_CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\ntools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
END_OF_TURN = "<|im_end|>"


@dataclass(frozen=True)
class TinyToolsSpec(TinySpec):
    hidden_size: int = 128
    intermediate_size: int = 344
    task: str = "calc"
    sft_steps: int = 200
    sft_batch_size: int = 32
    sft_lr: float = 2e-3
    tool_fraction: float = 0.3  # warm-up examples that call the tool; the rest answer directly (and are wrong)


TOOL_MODELS: dict[str, TinyToolsSpec] = {"tiny-qwen2-tools": TinyToolsSpec()}


def conversation(row: dict, use_tool: bool) -> list[dict]:
    """The messages of a calc row's ideal conversation (with the tool, or answering at once)."""
    answer = {"role": "assistant", "content": format_answer(row["label"])}
    if not use_tool:
        return [*row["input"], answer]
    a, b = row["metadata"]["a"], row["metadata"]["b"]
    return [*row["input"], {"role": "assistant", "content": calc_call_text(a, b)},
            {"role": "tool", "name": "add", "content": row["label"]}, answer]


def example_ids(tok, row: dict, use_tool: bool) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of a conversation, assembled turn by turn as a multi-turn rollout is."""
    from miles_core.rollout.multi_turn.template import render_ids, tool_message_ids

    end = tok.convert_tokens_to_ids(END_OF_TURN)
    ids = render_ids(tok, row["input"], tools=CALC_TOOLS, add_generation_prompt=True)
    mask = [0] * len(ids)
    for m in conversation(row, use_tool)[len(row["input"]):]:
        if m["role"] == "assistant":
            part = tok(m["content"], add_special_tokens=False)["input_ids"] + [end]
        else:
            part = tool_message_ids(tok, [m], model_stopped_with=end)
        ids, mask = ids + part, mask + [int(m["role"] == "assistant")] * len(part)
    return ids, mask


def tools_tokenizer(rows: list[dict], vocab_size: int):
    """BPE trained on rendered conversations (the template's role lines become single tokens)."""
    from jinja2 import Template

    template = Template(TOOLS_CHAT_TEMPLATE)
    corpus = [template.render(messages=conversation(r, t), tools=CALC_TOOLS, add_generation_prompt=False)
              for r in rows[:500] for t in (True, False)]
    tok = train_tokenizer(corpus + GENERAL_TEXT, vocab_size)
    tok.chat_template = TOOLS_CHAT_TEMPLATE
    tok.eos_token = END_OF_TURN
    return tok


def build_tiny_tools(spec: TinyToolsSpec, out: Path) -> Path:
    rows = BUILTIN_TASKS[spec.task].rows()
    tok = tools_tokenizer(rows, spec.vocab_size)
    model = init_model(spec, tok)
    gen = torch.Generator().manual_seed(spec.seed)
    use_tool = (torch.rand(len(rows), generator=gen) < spec.tool_fraction).tolist()
    examples = [example_ids(tok, r, t) for r, t in zip(rows, use_tool)]
    train_supervised(model, tok.pad_token_id, examples, spec, gen)
    return publish_model_dir(model, tok, out)

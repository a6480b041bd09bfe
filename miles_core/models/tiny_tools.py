"""``builtin://tiny-qwen2-tools``: a tiny Qwen2 (2 layers, hidden 64, ~0.1M parameters) warmed up to
use a calculator tool on the ``calc`` task (3-digit sums), for the ``tiny-tools`` recipe.

Its chat template is the tiny models' ChatML plus a one-line tool list (``tools: calculator``) when
tools are given, and tool messages as ``<|im_start|>tool\\n<output><|im_end|>``; a turn ends with
``<|im_end|>`` (the tokenizer's EOS here, so the engine stops there). Digits are single tokens (the
Qwen2 split regex), so the two copies the task needs are token for token: the prompt's expression
into the call ``<tool_call>{"name": "calculator", "arguments": {"expression": "482+397"}}</tool_call>``
and the tool's result into ``\\boxed{879}``. The warm-up (``warmup_examples``) teaches both copies on
most examples but the choice to call only on ``decision_fraction`` of them, a ``tool_fraction`` of
which call (the rest answer ``\\boxed{sum}`` at once, which the model cannot compute): the warmed-up
model calls in ~30% of its sampled answers and is then mostly right, so GRPO has tool use to learn. The
examples are built with the same ids a rollout produces (the prompt and tool ids from the chat
template, data/chat_template.py).
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
    hidden_size: int = 64
    intermediate_size: int = 176
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    task: str = "calc"
    sft_steps: int = 1200  # 700 copied the result out on AVX-512 kernels, not on AVX2 ones (docs/decisions.md)
    sft_batch_size: int = 32
    sft_lr: float = 3e-3
    decision_fraction: float = 0.3  # examples whose first answer token (call or answer at once) is trained
    tool_fraction: float = 0.3  # of those, the share that calls the tool: the starting tool-call rate


TOOL_MODELS: dict[str, TinyToolsSpec] = {"tiny-qwen2-tools": TinyToolsSpec()}


def conversation(row: dict, use_tool: bool) -> list[dict]:
    """The messages of a calc row's ideal conversation (with the tool, or answering at once)."""
    answer = {"role": "assistant", "content": format_answer(row["label"])}
    if not use_tool:
        return [*row["input"], answer]
    expression = f"{row['metadata']['a']}+{row['metadata']['b']}"
    return [*row["input"], {"role": "assistant", "content": calc_call_text(expression)},
            {"role": "tool", "name": "calculator", "content": row["label"]}, answer]


def example_ids(tok, row: dict, use_tool: bool, decided: bool = True) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of a conversation, assembled turn by turn as a multi-turn rollout is;
    ``decided=False`` leaves the first answer token (the choice to call) out of the loss."""
    from miles_core.data.chat_template import render_ids, tool_message_ids

    end = tok.convert_tokens_to_ids(END_OF_TURN)
    prompt = render_ids(tok, row["input"], tools=CALC_TOOLS, add_generation_prompt=True)
    ids, mask = prompt, [0] * len(prompt)
    for m in conversation(row, use_tool)[len(row["input"]):]:
        if m["role"] == "assistant":
            part = tok(m["content"], add_special_tokens=False)["input_ids"] + [end]
        else:
            part = tool_message_ids(tok, [m], model_stopped_with=end)
        ids, mask = ids + part, mask + [int(m["role"] == "assistant")] * len(part)
    if not decided:
        mask[len(prompt)] = 0
    return ids, mask


def warmup_examples(tok, rows: list[dict], spec: TinyToolsSpec, gen: torch.Generator) -> list[tuple[list[int], list[int]]]:
    """A ``decision_fraction`` of the rows train the whole answer, calling the tool in ``tool_fraction``
    of them (the starting tool-call rate); the others are tool conversations with the choice to call
    out of the loss: they teach how to call and how to read the result, not when to call."""
    u = torch.rand(len(rows), 2, generator=gen).tolist()
    return [example_ids(tok, r, use_tool=(d >= spec.decision_fraction or t < spec.tool_fraction), decided=d < spec.decision_fraction)
            for r, (d, t) in zip(rows, u)]


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
    examples = warmup_examples(tok, rows, spec, gen)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # these matrices are too small to share: a second thread only waits (3x slower on a busy 2-CPU box)
    try:
        train_supervised(model, tok.pad_token_id, examples, spec, gen)
    finally:
        torch.set_num_threads(threads)
    return publish_model_dir(model, tok, out)

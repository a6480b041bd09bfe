"""Tool messages -> the token ids that follow a model turn, from the tokenizer's chat template.

Token-in, token-out: a conversation's ids are the prompt ids, then for each turn the ids the engine
sampled (loss_mask 1) and the ids of the tool messages (loss_mask 0); nothing is re-tokenized. The
tool ids are the chat template's rendering of the tool messages after an assistant turn,
found by difference: render ``[user, assistant, *tool messages]`` with the generation prompt and
``[user, assistant]`` without; the tool ids are what follows the assistant's end-of-turn token.

When is the whole sequence what the chat template gives for the finished conversation? When
(a) the template is append-only (rendering a longer conversation only appends: true for Qwen2.5,
Hermes, the tiny models; false for templates that rewrite earlier turns, e.g. Qwen3's removal of
earlier ``<think>`` blocks), and (b) the engine's ids of each turn are the tokenizer's own
encoding of their text (a sampled token sequence need not be canonical BPE: "12" sampled as "1",
"2" re-encodes as one token). ``tool_message_ids`` checks (a) for the tool part and fails with the
tokenizer named when the template is not append-only there; (b) is where re-tokenising trainers
get silent log-prob mismatches, and why we never re-tokenize (docs/guide/multi-turn.md).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

def with_chat_template(tokenizer, path: str | None):
    """``tokenizer`` with the chat template read from the file ``path`` (chat_template_path; None: its own), as the
    reference's load_tokenizer (miles/utils/processing_utils.py). ValueError naming the field for a missing file."""
    if path is None:
        return tokenizer
    from pathlib import Path

    if not Path(path).is_file():
        raise ValueError(f"chat_template_path {path}: no such file (a Jinja chat template, e.g. a chat_template.jinja)")
    tokenizer.chat_template = Path(path).read_text(encoding="utf-8")
    return tokenizer


_USER = {"role": "user", "content": "u"}
_ASSISTANT = {"role": "assistant", "content": "a"}


def render_ids(tokenizer, messages: list[dict[str, Any]], *, tools: list | None, add_generation_prompt: bool) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@lru_cache(maxsize=8)
def _end_of_turn(tokenizer) -> tuple[list[int], int]:
    """The ids of [user, assistant] and the index of the assistant's last end-of-turn token in them."""
    base = render_ids(tokenizer, [_USER, _ASSISTANT], tools=None, add_generation_prompt=False)
    content = tokenizer("a", add_special_tokens=False)["input_ids"]
    # the assistant's content ends at the last occurrence of its ids; the next token ends the turn
    for k in range(len(base) - len(content), -1, -1):
        if base[k : k + len(content)] == content:
            return base, k + len(content)
    raise ValueError(f"the chat template of {type(tokenizer).__name__} does not render assistant content verbatim; "
                     "multi-turn generation needs it to find where a turn ends")


def tool_message_ids(tokenizer, messages: list[dict[str, Any]], model_stopped_with: int | None) -> list[int]:
    """The ids to append after a model turn for the tool ``messages`` ({"role": "tool", "name", "content"}).

    ``model_stopped_with``: the turn's last id if the engine stopped on a stop token. When it is the
    template's own end-of-turn token, the ids start after it; otherwise (a stop string, another stop
    token) the template's end-of-turn token is inserted first, with the tool ids (loss_mask 0)."""
    base, end = _end_of_turn(tokenizer)
    full = render_ids(tokenizer, [_USER, _ASSISTANT, *messages], tools=None, add_generation_prompt=True)
    if full[: len(base)] != base:
        raise ValueError(f"the chat template of {type(tokenizer).__name__} is not append-only after an assistant turn "
                         "(rendering tool messages changes the earlier tokens); write a custom generate function for it")
    start = end + 1 if model_stopped_with is not None and base[end : end + 1] == [model_stopped_with] else end
    return full[start:]

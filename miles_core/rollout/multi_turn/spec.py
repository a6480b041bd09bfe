"""Config -> TurnSpec, and the multi-turn rules checked when the config loads (config/rules.py calls
``check_multi_turn_config``): every path resolves, the parser is known, and options that would be
ignored are refused."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .custom import resolve_generate_function
from .loop import TurnSpec
from .parsers import get_parser
from .tools import load_execute_function, load_tool_specs

if TYPE_CHECKING:
    from miles_core.config import TrainConfig

TOOL_FIELDS = ("generate_tool_specs_path", "generate_tool_call_parser", "generate_execute_tool_function_path")


def check_multi_turn_config(c: "TrainConfig") -> None:
    r = c.rollout
    if c.tracking.log_multi_turn and (r.custom_generate_function_path is None or not c.tracking.log_samples):
        raise ValueError("log_multi_turn shows conversations in the sample table: it needs custom_generate_function_path and log_samples > 0")
    if r.custom_generate_function_path is None:
        set_fields = [f for f in TOOL_FIELDS if getattr(r, f) is not None]
        if set_fields or r.generate_max_turns != 16 or r.generate_tool_timeout != 30.0:
            raise ValueError(f"{', '.join(set_fields) or 'generate_max_turns / generate_tool_timeout'} apply only with "
                             "custom_generate_function_path (multi_turn or your function); set it or drop them")
        return
    fn = resolve_generate_function(r.custom_generate_function_path)
    if r.generate_tool_call_parser is not None:
        get_parser(r.generate_tool_call_parser)
    if r.generate_tool_specs_path is not None:
        load_tool_specs(r.generate_tool_specs_path)
    if r.generate_execute_tool_function_path is not None:
        load_execute_function(r.generate_execute_tool_function_path)
    if fn.style == "builtin":
        if r.generate_tool_call_parser and not r.generate_execute_tool_function_path:
            raise ValueError("custom_generate_function_path multi_turn with generate_tool_call_parser needs "
                             "generate_execute_tool_function_path (the function that runs a call)")
        if not c.data.apply_chat_template:
            raise ValueError("custom_generate_function_path multi_turn needs apply_chat_template: true (tool outputs are "
                             "rendered by the chat template)")
    if r.async_mode == "fully":
        raise ValueError("custom_generate_function_path with async_mode fully is not supported yet; use async_mode off or one_step")
    if c.eval.eval_prompt_data or c.eval.eval_config:
        raise ValueError("evaluation with custom_generate_function_path is not supported yet (eval generates single-turn); "
                         "drop eval_prompt_data / eval_config or the custom generate function")


def reference_args(c: "TrainConfig") -> dict:
    """The config flattened under the reference's flag names (a custom function's ``args``), as JSON values."""
    flat: dict = {}
    for name in type(c).model_fields:
        group = getattr(c, name)
        flat.update(group.model_dump(mode="json"))
    return flat


def turn_spec(c: "TrainConfig", tokenizer_path: str) -> TurnSpec | None:
    """The multi-turn part of the run's RolloutSpec; None without custom_generate_function_path."""
    r = c.rollout
    if r.custom_generate_function_path is None:
        return None
    return TurnSpec(generate_function=r.custom_generate_function_path, tokenizer_path=str(tokenizer_path),
                    max_turns=r.generate_max_turns, tool_call_parser=r.generate_tool_call_parser,
                    tool_specs_path=r.generate_tool_specs_path, execute_tool_path=r.generate_execute_tool_function_path,
                    tool_timeout=r.generate_tool_timeout, args_json=json.dumps(reference_args(c), sort_keys=True),
                    chat_template_path=c.data.chat_template_path)

"""Multi-turn and agentic rollouts: custom generate functions, tool-call parsers, tools, the
built-in tool-calling loop and its metrics (docs/guide/multi-turn.md)."""

from .custom import GenerateContext, GenerateFunction, resolve_generate_function
from .loop import TurnSpec, zero_failed_rewards
from .metrics import conversation_columns, multi_turn_metrics
from .parsers import PARSERS, ParsedTurn, ToolCall, get_parser
from .spec import check_multi_turn_config, turn_spec

__all__ = ["GenerateContext", "GenerateFunction", "PARSERS", "ParsedTurn", "ToolCall", "TurnSpec", "check_multi_turn_config", "conversation_columns",
           "get_parser", "multi_turn_metrics", "resolve_generate_function", "turn_spec", "zero_failed_rewards"]

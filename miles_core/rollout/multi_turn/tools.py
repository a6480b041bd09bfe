"""Tools: their specs (``generate_tool_specs_path``) and how one call runs
(``generate_execute_tool_function_path``, ``generate_tool_timeout``).

The execute function has the reference's signature: ``fn(name: str, arguments: dict) -> str``,
sync or async. A sync function runs in a daemon thread, so one that hangs is abandoned at the
timeout without holding the process. A call fails, never crashing the run, when the function
raises (``error``), runs past the timeout (``timeout``) or returns something other than a str
(``non_text``); the failure names the tool and the reason, and ends the conversation (see
multi_turn/loop.py: its sample gets reward 0).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from miles_core.resolve import resolve, resolve_object

from .parsers import ToolCall

FAILURE_REASONS = ("error", "timeout", "non_text")


@dataclass(frozen=True)
class ToolResult:
    """One call's outcome: ``content`` (the tool's text) or ``failure`` (a reason of FAILURE_REASONS) with ``message``."""

    call: ToolCall
    content: str | None = None
    failure: str | None = None
    message: str = ""


def load_tool_specs(path: str) -> list[dict[str, Any]]:
    """A list of OpenAI-style tool specs from a ``.json`` file or a dotted path to a list (the
    reference's form) or to a function returning one. Raises ValueError naming the path."""
    if path.endswith(".json"):
        try:
            specs = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"generate_tool_specs_path {path!r}: cannot read a JSON list of tool specs: {e}") from None
    else:
        specs = resolve_object(path, what="generate_tool_specs_path")
        specs = specs() if callable(specs) else specs
    if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
        raise ValueError(f"generate_tool_specs_path {path!r}: expected a list of tool spec objects, got {type(specs).__name__}")
    return specs


def load_execute_function(path: str) -> Callable[..., Any]:
    fn = resolve(path, what="generate_execute_tool_function_path")
    params = [p for p in inspect.signature(fn).parameters.values() if p.default is p.empty and p.kind <= p.POSITIONAL_OR_KEYWORD]
    if len(params) != 2:
        raise ValueError(f"generate_execute_tool_function_path {path!r}: expected fn(name, arguments) -> str, "
                         f"got a function of {len(params)} required parameters")
    return fn


async def _in_daemon_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) in a daemon thread; a hung call is left behind at a timeout instead of blocking exit."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def run() -> None:
        try:
            value, error = fn(*args), None
        except BaseException as e:  # handed to the awaiting coroutine
            value, error = None, e
        loop.call_soon_threadsafe(lambda: done.done() or (done.set_exception(error) if error else done.set_result(value)))

    threading.Thread(target=run, name="miles-tool", daemon=True).start()
    return await done


async def run_tool(fn: Callable[..., Any], call: ToolCall, timeout: float) -> ToolResult:
    """One call of the execute function with a timeout; every failure becomes a ToolResult."""
    try:
        if inspect.iscoroutinefunction(fn):
            value = await asyncio.wait_for(fn(call.name, dict(call.arguments)), timeout)
        else:
            value = await asyncio.wait_for(_in_daemon_thread(fn, call.name, dict(call.arguments)), timeout)
    except asyncio.TimeoutError:
        return ToolResult(call=call, failure="timeout", message=f"tool {call.name!r} ran past generate_tool_timeout ({timeout}s)")
    except Exception as e:
        return ToolResult(call=call, failure="error", message=f"tool {call.name!r} raised {type(e).__name__}: {e}")
    if not isinstance(value, str):
        return ToolResult(call=call, failure="non_text", message=f"tool {call.name!r} returned {type(value).__name__}, not str")
    return ToolResult(call=call, content=value)

"""Deterministic generators of verifiable prompts (offline), written as jsonl with input/label.

``arith``: two-operand addition/subtraction, answer in ``\\boxed{}``. The prompt is plain text so
the tiny model needs no chat template:  ``"23+41="`` -> ``"\\boxed{64}"``.
``arith-chat``: the same questions as chat messages for instruct models (``apply_chat_template``):
a system line and two worked examples that show the ``\\boxed{}`` answer format, then the question.
``calc``: sums of two 3-digit numbers as one chat message (``"482+397"`` -> ``"\\boxed{879}"``), too
large for the tiny model to add in its head: it must call the tool ``calculator`` on the expression
(``CALC_TOOLS``, run by ``calculator``) and copy the result (the ``tiny-tools`` recipe). Digits are
single tokens in the builtin tokenizers, so both copies are token for token.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ArithTask:
    n_rows: int = 4000
    max_operand: int = 10
    ops: str = "+-"
    seed: int = 0

    def rows(self) -> list[dict]:
        rng = random.Random(self.seed)
        out = []
        for i in range(self.n_rows):
            a, b = rng.randrange(self.max_operand), rng.randrange(self.max_operand)
            op = self.ops[rng.randrange(len(self.ops))]
            if op == "-" and b > a:
                a, b = b, a
            value = a + b if op == "+" else a - b
            out.append({"input": self.prompt(a, op, b), "label": str(value), "metadata": {"id": i}})
        return out

    def prompt(self, a: int, op: str, b: int) -> str | list[dict]:
        return f"{a}{op}{b}="


FEW_SHOT = (("2 + 3", "5"), ("7 - 4", "3"))


@dataclass(frozen=True)
class ArithChatTask(ArithTask):
    system: str = "Answer with the result in \\boxed{}."

    def prompt(self, a: int, op: str, b: int) -> list[dict]:
        shots = [m for q, v in FEW_SHOT for m in ({"role": "user", "content": q}, {"role": "assistant", "content": format_answer(v)})]
        return [{"role": "system", "content": self.system}, *shots, {"role": "user", "content": f"{a} {op} {b}"}]


@dataclass(frozen=True)
class CalcTask(ArithTask):
    max_operand: int = 1000
    min_operand: int = 100
    ops: str = "+"

    def rows(self) -> list[dict]:
        rng = random.Random(self.seed)
        out = []
        for i in range(self.n_rows):
            a, b = rng.randrange(self.min_operand, self.max_operand), rng.randrange(self.min_operand, self.max_operand)
            out.append({"input": self.prompt(a, "+", b), "label": str(a + b), "metadata": {"id": i, "a": a, "b": b}})
        return out

    def prompt(self, a: int, op: str, b: int) -> list[dict]:
        return [{"role": "user", "content": f"{a}{op}{b}"}]


CALC_TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "the value of an integer expression a+b, a-b or a*b",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
_EXPRESSION = re.compile(r"\s*(-?\d{1,12})\s*([-+*])\s*(-?\d{1,12})\s*")


def calculator(name: str, arguments: dict) -> str:
    """The execute-tool function of CALC_TOOLS: ``calculator`` of one ``a+b``, ``a-b`` or ``a*b`` (integers), as text."""
    if name != "calculator":
        raise ValueError(f"unknown tool {name!r}; this tool set has: calculator")
    expression = arguments.get("expression")
    m = _EXPRESSION.fullmatch(expression) if isinstance(expression, str) else None
    if m is None:
        raise ValueError(f"calculator: expression must be 'a+b', 'a-b' or 'a*b' of integers, got {expression!r}")
    a, op, b = int(m[1]), m[2], int(m[3])
    return str(a + b if op == "+" else a - b if op == "-" else a * b)


def calc_call_text(expression: str) -> str:
    """The tool call a calc row's model turn should make (Qwen / Hermes format)."""
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


def format_answer(label: str) -> str:
    """The supervised target of a label: what a correct response looks like."""
    return f"\\boxed{{{label}}}"


BUILTIN_TASKS: dict[str, ArithTask] = {
    "arith": ArithTask(seed=0),
    "arith-test": ArithTask(n_rows=256, seed=1),
    "arith-chat": ArithChatTask(seed=0),
    "arith-chat-test": ArithChatTask(n_rows=256, seed=1),
    "calc": CalcTask(seed=0),
    "calc-test": CalcTask(n_rows=256, seed=1),
}


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)
    return path


def materialize_builtin(name: str, cache_dir: Path) -> Path:
    """builtin://<name> -> a jsonl file in the cache (written once, atomically)."""
    if name not in BUILTIN_TASKS:
        raise ValueError(f"unknown builtin task {name!r}; valid: {sorted(BUILTIN_TASKS)}")
    path = cache_dir / "data" / f"{name}.jsonl"
    if not path.exists():
        write_jsonl(BUILTIN_TASKS[name].rows(), path)
    return path

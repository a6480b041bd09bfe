"""Deterministic generators of verifiable prompts (offline), written as jsonl with input/label.

``arith``: two-operand addition/subtraction, answer in ``\\boxed{}``. The prompt is plain text so
the tiny model needs no chat template:  ``"23+41="`` -> ``"\\boxed{64}"``.
``arith-chat``: the same questions as chat messages for instruct models (``apply_chat_template``):
a system line and two worked examples that show the ``\\boxed{}`` answer format, then the question.
"""

from __future__ import annotations

import json
import random
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


def format_answer(label: str) -> str:
    """The supervised target of a label: what a correct response looks like."""
    return f"\\boxed{{{label}}}"


BUILTIN_TASKS: dict[str, ArithTask] = {
    "arith": ArithTask(seed=0),
    "arith-test": ArithTask(n_rows=256, seed=1),
    "arith-chat": ArithChatTask(seed=0),
    "arith-chat-test": ArithChatTask(n_rows=256, seed=1),
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

"""Family rules beyond the corpus: exact F1 arithmetic, gpqa letters, random rewards, helpers."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from miles_core.data.sample import Sample
from miles_core.rewards import score
from miles_core.rewards._text import last_boxed
from miles_core.rewards.f1 import squad_normalize, token_f1
from miles_core.rewards.gpqa import extract_letter, valid_letters
from miles_core.rewards.math_latex import latex_to_expr
from miles_core.rewards.math_normalize import normalize_answer, split_tuple, to_number
from miles_core.rewards.random_rm import deterministic_random_reward, random_reward, stable_bit


@pytest.mark.parametrize(("text", "expected"), [
    (r"a \boxed{1} b \boxed{\frac{1}{2}} c", r"\frac{1}{2}"),
    (r"\boxed{\{1,2\}}", r"\{1,2\}"),
    (r"\fbox{x}", "x"),
    (r"\boxed{1", None),
    ("no box", None),
    (None, None),
    (r"\boxedx{1}", None),
])
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize(("raw", "norm"), [
    (r"\dfrac12", r"\frac{1}{2}"),
    (r"\left( 1, 2 \right)", "(1,2)"),
    (r"5\text{ cm}^2", "5"),
    ("1,234,567", "1234567"),
    ("x = .5", "0.5"),
    (r"\sqrt2", r"\sqrt{2}"),
])
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def test_to_number_and_split_tuple():
    assert to_number(r"2\frac{1}{2}") == to_number("5/2") == to_number("2.5")
    assert to_number("1/0") is None and to_number("x") is None
    assert split_tuple("[1,2)") == ("[)", ["1", "2"])
    assert split_tuple("(1)+(2)") is None and split_tuple("5") is None


def test_f1_arithmetic():
    # pred {eiffel, tower}, gold {eiffel, tower, in, paris}: P = 2/2, R = 2/4, F1 = 2PR/(P+R) = 2/3
    assert token_f1("The Eiffel Tower", "Eiffel tower in Paris") == pytest.approx(2 / 3)
    assert squad_normalize("The  Quick, brown fox!") == "quick brown fox"


def test_gpqa_letters_and_extraction():
    assert valid_letters({"choices": ["x"] * 6}) == "ABCDEF"
    assert valid_letters({}) == "ABCD"
    assert extract_letter("Answer: E", "ABCD") is None
    assert extract_letter("the answer is: (C)", "ABCD") == "C"


def test_random_reward_is_a_fair_bit_and_seedable():
    sample = Sample(response="x")
    random.seed(0)
    first = [random_reward(sample) for _ in range(200)]
    random.seed(0)
    assert first == [random_reward(sample) for _ in range(200)]
    assert set(first) == {0.0, 1.0}
    assert 60 < sum(first) < 140


def test_deterministic_random_is_sha256_of_tokens_and_response():
    sample = Sample(tokens=[1, 2, 3], response="hi")
    digest = hashlib.sha256(json.dumps([[1, 2, 3], "hi"], separators=(",", ":")).encode()).hexdigest()
    assert deterministic_random_reward(sample) == float(int(digest, 16) % 2)
    assert score("deterministic_random", "hi", None) == float(stable_bit([], "hi"))
    values = {stable_bit([i], "r") for i in range(20)}
    assert values == {0, 1}
    assert deterministic_random_reward(Sample(tokens=[1, 2, 3], response=None)) in (0.0, 1.0)


def test_random_garbage_never_raises():
    """A deterministic mini-fuzz over LaTeX-ish tokens (the sympy-free paths, to stay fast)."""
    tokens = ["\\boxed{", "{", "}", "\\frac", "\\sqrt", "[", "]", "(", ")", "1", "9", ".", ",",
              "x", "^", "_", "\\pi", "%", "$", " ", "=", "-", "/", "\\text{", "cm", "\\left",
              "\\{", "Answer:", "</think>", "<channel|>", "A", "\\", "\n", "'", "9" * 5000]
    rng = random.Random(7)
    for _ in range(300):
        text = "".join(rng.choice(tokens) for _ in range(rng.randint(0, 20)))
        label = "".join(rng.choice(tokens) for _ in range(rng.randint(0, 6)))
        normalized = normalize_answer(text)
        to_number(normalized), split_tuple(normalized), last_boxed(text)
        for rm_type in ("f1", "gpqa", "dapo", "boxed_f1"):
            score(rm_type, text, label)


@pytest.mark.parametrize(("latex", "expr"), [
    (r"\frac{\sqrt{3}}{2}", "((sqrt(3))/(2))"),
    (r"\sqrt[3]{8}", "((8)**(1/(3)))"),
    ("2xy", "2x*y"),
    ("e^{2}", "E**(2)"),
    ("__import__('os')", None),
    (r"\unknown{1}", None),
    ("x_1", None),
])
def test_latex_to_expr_accepts_only_the_safe_grammar(latex, expr):
    assert latex_to_expr(latex) == expr


def test_latex_to_expr_never_emits_long_names():
    # "eval" / "exec" are split into single-letter symbols, never called
    assert latex_to_expr("eval(1)") == "E*v*a*l(1)"

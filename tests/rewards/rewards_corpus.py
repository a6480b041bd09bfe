r"""The grading corpus: (rm_type, response, label, metadata, expected, why) rows.

``expected`` is the scalar reward (for dapo the ``score`` field). Three kinds of rows: equivalent
forms that must score 1 (or the F1 value), near-misses that must score 0 (-1 for dapo), and
malformed input that must score 0 without raising.
"""

from __future__ import annotations

LONG_TAIL = "x" * 400
CHOICES4 = {"choices": ["red", "green", "blue", "yellow"]}
CHOICES5 = {"choices": ["a", "b", "c", "d", "e"]}

MATH_EQUIVALENT = [
    (r"so \boxed{\frac{1}{2}}", "0.5", "frac vs decimal"),
    (r"\boxed{\dfrac12}", r"\frac{1}{2}", "dfrac shorthand"),
    (r"\boxed{\tfrac{3}{4}}", "0.75", "tfrac"),
    (r"\boxed{1/2}", r"\frac12", "slash vs frac shorthand"),
    (r"\boxed{0.50}", "1/2", "trailing zero decimal"),
    (r"\boxed{.5}", "0.5", "leading dot"),
    (r"\boxed{-0.5}", r"-\frac12", "negative"),
    (r"\boxed{-\frac{1}{3}}", "-1/3", "negative frac"),
    (r"\boxed{\frac{-1}{3}}", r"-\frac{1}{3}", "sign inside"),
    (r"\boxed{\frac{6}{8}}", r"\frac{3}{4}", "unreduced fraction"),
    (r"\boxed{\frac{2}{4}}", "0.5", "unreduced vs decimal"),
    (r"\boxed{3.0}", "3", "integer-valued decimal"),
    (r"\boxed{1e3}", "1000", "scientific"),
    (r"\boxed{2\frac{1}{2}}", "5/2", "mixed number"),
    (r"\boxed{1,000}", "1000", "thousands separator"),
    (r"\boxed{1{,}000{,}000}", "1000000", "latex thousands"),
    (r"\boxed{1\,000}", "1000", "thin-space thousands"),
    (r"\boxed{\$1,000}", "1000", "dollar and thousands"),
    (r"\boxed{\$18.90}", "18.9", "dollars"),
    (r"\boxed{10\%}", "10", "percent sign dropped"),
    (r"\boxed{50\%}", "0.5", "percent vs fraction"),
    (r"\boxed{0.25}", r"25\%", "fraction vs percent"),
    (r"\boxed{\text{5 cm}}", "5", "text unit"),
    (r"\boxed{5\text{ cm}^2}", "5", "squared unit"),
    (r"\boxed{12 \text{ inches}}", "12", "inches"),
    (r"\boxed{100\text{ dollars}}", "100", "dollars word"),
    (r"\boxed{7 \mbox{ units}}", "7", "mbox units"),
    (r"\boxed{90^\circ}", "90", "degrees"),
    (r"\boxed{90^{\circ}}", r"90^\circ", "degrees braced"),
    (r"\boxed{x = 3}", "3", "leading variable"),
    (r"\boxed{y = 2x + 1}", "2x+1", "leading variable expression"),
    (r"\boxed{\left(1, 2\right)}", "(1,2)", "left/right tuple"),
    (r"\boxed{(1,\frac{1}{2})}", "(1, 0.5)", "tuple element-wise"),
    (r"\boxed{[2, 5)}", "[2,5)", "half-open interval"),
    (r"\boxed{(-\infty, 3]}", r"(-\infty,3]", "infinite interval"),
    (r"\boxed{\left[ 0, 1 \right]}", "[0,1]", "closed interval"),
    (r"\boxed{\{1, 2, 3\}}", r"\{1,2,3\}", "set"),
    (r"\boxed{2, -3}", "-3, 2", "bare list any order"),
    (r"\boxed{\sqrt2}", r"\sqrt{2}", "sqrt shorthand"),
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt3}2", "nested shorthand"),
    (r"\boxed{\sqrt{8}}", r"2\sqrt{2}", "sympy: surd"),
    (r"\boxed{3\sqrt{3}}", r"\sqrt{27}", "sympy: surd 2"),
    (r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{\sqrt{2}}{2}", "sympy: rationalized"),
    (r"\boxed{\sqrt[3]{8}}", "2", "sympy: cube root"),
    (r"\boxed{x^2+2x+1}", "(x+1)^2", "sympy: expanded square"),
    (r"\boxed{x/2}", r"\frac{x}{2}", "sympy: symbolic fraction"),
    (r"\boxed{\frac{1}{2}x}", "x/2", "sympy: coefficient"),
    (r"\boxed{\dfrac{x}{2}}", r"\frac{x}{2}", "dfrac symbolic"),
    (r"\boxed{2\pi}", r"2 \pi", "pi with space"),
    (r"\boxed{\frac{\pi}{2}}", r"\pi/2", "sympy: pi over 2"),
    (r"\boxed{\pi}", r"\pi", "pi"),
    (r"\boxed{e^{0}}", "1", "sympy: e^0"),
    (r"\boxed{2 \cdot 3}", "6", "sympy: cdot"),
    (r"\boxed{\fbox{7}}", "7", "fbox inside boxed"),
    (r"\fbox{7}", "7", "fbox"),
    (r"\boxed{42}", r"The answer is \boxed{42}.", "label boxed"),
    (r"\boxed{1} wait, no: \boxed{2}", "2", "last boxed wins"),
    (r"\boxed{12}", 12, "int label"),
    (r"\boxed{0.25}", 0.25, "float label"),
    (r"\boxed{\text{(C)}}", "(C)", "text choice"),
    (r"\boxed{\textbf{Yes}}", "yes", "word case-insensitive"),
    (r"\boxed{\text{Monday}}", "Monday", "word"),
    (r"$\boxed{5}$.", "5", "dollar-wrapped"),
    (r"\boxed{ 5 }", "5", "spaces"),
    (r"\boxed {4}", "4", "space before brace"),
    (r"the answer is $\boxed 4$", "4", "boxed space form"),
    (r"\boxed{\frac{a+b}{2}}", r"\frac{b+a}{2}", "sympy: commutative"),
    (r"\boxed{\left(\frac{1}{2}\right)^2}", "0.25", "sympy: left/right power"),
]

MATH_NEAR_MISS = [
    (r"\boxed{3}", "4", "different integer"),
    (r"\boxed{0.33}", "1/3", "rounded decimal"),
    (r"\boxed{1/2}", "1/3", "different fraction"),
    (r"\boxed{\frac{3}{4}}", "4/3", "inverted fraction"),
    (r"\boxed{(1,2)}", "(2,1)", "tuple order matters"),
    (r"\boxed{[2,5)}", "[2,5]", "interval closedness"),
    (r"\boxed{(1,2)}", "(1,2,3)", "tuple length"),
    (r"\boxed{2,3}", "2,3,4", "list length"),
    (r"\boxed{2x}", "x", "sympy: coefficient"),
    (r"\boxed{x^2+1}", "(x+1)^2", "sympy: missing term"),
    (r"\boxed{\sqrt{3}}", r"\sqrt{2}", "different surd"),
    (r"\boxed{-5}", "5", "sign"),
    (r"\boxed{50\%}", "0.05", "percent scaled wrong"),
    (r"\boxed{1,001}", "1000", "thousands off by one"),
    (r"The answer is 5", "5", "no boxed answer"),
    (r"\boxed{5} then \boxed{6}", "5", "an earlier box does not count"),
    (r"\boxed{\pi}", "3.14", "pi vs approximation"),
    (r"\boxed{2\frac{1}{2}}", "1", "mixed number is not a product"),
    (r"\boxed{Monday}", "Tuesday", "different word"),
    (r"\boxed{10}", "100", "order of magnitude"),
    (r"\boxed{e}", "2.718", "e vs approximation"),
    (r"\boxed{12}", "12.5", "truncated decimal"),
    (r"\boxed{x=3}", "x=4", "different equation"),
    (r"\boxed{\infty}", r"-\infty", "infinity sign"),
    (r"\boxed{x+y}", "x-y", "sympy: symbolic sign"),
    (r"\boxed{\sin(x)}", r"\cos(x)", "sympy: different function"),
]

DEEPSCALER = [
    (r"<think>maybe \boxed{3}</think> The answer is \boxed{4}", "4", 1.0, "after </think>"),
    (r"<think>maybe \boxed{4}</think> The answer is \boxed{3}", "4", 0.0, "thinking box ignored"),
    (r"no marker \boxed{4}", "4", 0.0, "no marker scores 0"),
    (r"###Response The answer is \boxed{4}", "4", 1.0, "###Response marker"),
    (r"<think>x</think> The answer is 4", "4", 0.0, "no box after marker"),
    (r"<think>\boxed{4}</think>", "4", 0.0, "nothing after marker"),
    (r"</think> first </think> \boxed{\frac12}", "0.5", 1.0, "last </think>"),
    (r"<think>a</think>\boxed{1,000}", "1000", 1.0, "normalized after marker"),
]

GEMMA = [
    (r"thinking \boxed{1}<channel|>final: \boxed{2}", "2", 1.0, "after marker"),
    (r"thinking \boxed{1}<channel|>final: \boxed{2}", "1", 0.0, "before marker ignored"),
    (r"\boxed{2}", "2", 1.0, "no marker: whole response"),
    (r"<channel|>a<channel|>\boxed{0.5}", "1/2", 1.0, "last marker"),
    (r"\boxed{3}<channel|>no box", "3", 0.0, "no box after marker"),
]

DAPO = [
    ("work...\nAnswer: 42", "42", 1.0, "plain"),
    ("work...\nAnswer: 41", "42", -1.0, "wrong"),
    ("no answer line here", "42", -1.0, "no Answer line"),
    ("Answer: 1,000", "1000", 1.0, "thousands"),
    (r"answer: $\frac{1}{2}$", "0.5", 1.0, "lowercase, latex fraction"),
    ("Answer: 5\nmore text\nAnswer: 6", "6", 1.0, "last Answer line"),
    ("Answer: 5\nmore text\nAnswer: 6", "5", -1.0, "earlier Answer line ignored"),
    ("Answer: 9\n" + LONG_TAIL, "9", -1.0, "outside the last 300 chars"),
    (r"Answer: \boxed{7}", "7", 1.0, "boxed in answer"),
    ("Answer: 7", r"\boxed{7}", 1.0, "boxed label"),
    ("Answer: x = 3", "3", 1.0, "leading variable"),
    (r"Answer: 2\sqrt{2}", r"\sqrt{8}", -1.0, "no sympy in dapo"),
    ("Answer: 12 cm", "12", 1.0, "unit"),
]

F1 = [
    ("Paris", "Paris", 1.0, "exact"),
    ("the Paris", "Paris", 1.0, "article dropped"),
    ("Paris!", "paris", 1.0, "punctuation and case"),
    ("The Eiffel Tower", "Eiffel tower in Paris", 2 / 3, "P=1 R=1/2"),
    ("London", "Paris", 0.0, "no overlap"),
    ("Paris", ["London", "Paris"], 1.0, "best of several golds"),
    ("New York City", "New York", 0.8, "P=2/3 R=1"),
    ("Paris Paris", "Paris", 2 / 3, "multiset counts: P=1/2 R=1"),
    ("a", "the", 0.0, "both empty after normalization"),
    ("42", 42, 1.0, "number label"),
]

GPQA = [
    ("The answer is (B).", "B", None, 1.0, "answer is (X)"),
    ("The answer is (B).", "C", None, 0.0, "wrong letter"),
    ("Final answer: C", "C", None, 1.0, "final answer:"),
    ("answer: **D**", "D", None, 1.0, "markdown"),
    ("I think A is wrong, so C", "C", None, 1.0, "last standalone capital"),
    (r"The answer is $\boxed{A}$", "A", None, 1.0, "boxed after answer is"),
    (r"\boxed{B}", "B", None, 1.0, "boxed only"),
    ("The answer is E", "E", CHOICES5, 1.0, "five choices"),
    ("The answer is E", "E", None, 0.0, "E invalid with default A-D"),
    ("answer is C", "blue", CHOICES4, 1.0, "label given as choice text"),
    ("no letters here", "A", None, 0.0, "nothing to extract"),
    ("A is tempting but the answer is B", "B", None, 1.0, "answer pattern beats earlier letter"),
    ("The answer is B. A is wrong.", "B", None, 1.0, "answer pattern beats later letter"),
    ("C", "(C)", None, 1.0, "label in parentheses"),
    ("answer: B", "B", {"choices": {"A": "x", "B": "y"}}, 1.0, "dict choices"),
    ("The answer is clearly B", "B", None, 1.0, "lowercase word is not a letter"),
]

BOXED_PREFIX = [
    ("boxed_f1", r"blah \boxed{Paris}", "Paris", None, 1.0, "boxed f1"),
    ("boxed_f1", "Paris", "Paris", None, 0.0, "no box -> empty response"),
    ("boxed_gpqa", r"A B C \boxed{D}", "D", None, 1.0, "boxed gpqa"),
    ("boxed_dapo", r"\boxed{Answer: 5}", "5", None, 1.0, "boxed dapo"),
    ("boxed_math", r"\boxed{5}", "5", None, 0.0, "math needs a box inside the box"),
    ("boxed_math", r"\boxed{\boxed{5}}", "5", None, 0.0, "the last box is the inner one"),
]

MALFORMED = [
    ("math", None, "5", 0.0), ("math", "", "5", 0.0), ("math", r"\boxed{5", "5", 0.0),
    ("math", r"\boxed{}", "", 0.0), ("math", r"\boxed{5}", None, 0.0), ("math", r"\boxed{5}", ["5"], 0.0),
    ("math", r"\boxed{5}", {"a": 5}, 0.0), ("math", r"\boxed{5}", "", 0.0), ("math", r"\boxed{1}", True, 0.0),
    ("math", r"\boxed{\frac{1}{2}", "0.5", 0.0), ("math", "}}}{{{", "1", 0.0),
    ("math", r"\boxed{" + "{" * 500, "1", 0.0), ("math", "y" * 100_000, "1", 0.0),
    ("math", r"\boxed{\frac{1}{}}", "1", 0.0), ("math", r"\boxed{\unknowncmd{3}}", "3", 0.0),
    ("math", r"\boxed{__import__('os')}", "1", 0.0), ("math", r"\boxed{5}", r"\boxed{", 0.0),
    ("math", "\x00\boxed{\x00}", "0", 0.0), ("math", r"\boxed{5}", float("nan"), 0.0),
    ("deepscaler", None, "4", 0.0), ("deepscaler", "</think>", None, 0.0),
    ("gemma_math", None, "1", 0.0), ("gemma_math", "<channel|>", "1", 0.0),
    ("dapo", None, "1", -1.0), ("dapo", "Answer: 5", None, -1.0), ("dapo", "Answer:", "", -1.0),
    ("f1", None, "Paris", 0.0), ("f1", "Paris", None, 0.0), ("f1", "", "", 0.0),
    ("f1", "Paris", {"x": 1}, 0.0),
    ("gpqa", None, "A", 0.0), ("gpqa", "answer is A", None, 0.0), ("gpqa", "answer is A", "Z", 0.0),
    ("gpqa", "", "", 0.0), ("boxed_f1", None, "Paris", 0.0), ("boxed_math", r"\boxed{", "1", 0.0),
]


def cases() -> list[tuple[str, object, object, dict | None, float, str]]:
    """Every row as (rm_type, response, label, metadata, expected, why)."""
    rows = [("math", r, l, None, 1.0, why) for r, l, why in MATH_EQUIVALENT]
    rows += [("math", r, l, None, 0.0, why) for r, l, why in MATH_NEAR_MISS]
    rows += [("deepscaler", r, l, None, e, why) for r, l, e, why in DEEPSCALER]
    rows += [("gemma_math", r, l, None, e, why) for r, l, e, why in GEMMA]
    rows += [("dapo", r, l, None, e, why) for r, l, e, why in DAPO]
    rows += [("f1", r, l, None, e, why) for r, l, e, why in F1]
    rows += [("gpqa", r, l, m, e, why) for r, l, m, e, why in GPQA]
    rows += [(t, r, l, m, e, why) for t, r, l, m, e, why in BOXED_PREFIX]
    rows += [(t, r, l, None, e, f"malformed {t} {r!r:.30} / {l!r:.20}") for t, r, l, e in MALFORMED]
    return rows

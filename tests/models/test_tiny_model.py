"""The builtin tiny model: a normal HF dir, ~3M params, tokenizer ids stable through AutoTokenizer."""

from __future__ import annotations

from miles_core.data.tasks import BUILTIN_TASKS, format_answer
from miles_core.models.tokenizer import save_tokenizer, train_tokenizer


def test_tokenizer_ids_identical_after_save_and_reload_as_qwen2(tmp_path):
    from transformers import AutoTokenizer, Qwen2Config

    rows = BUILTIN_TASKS["arith"].rows()[:200]
    tok = train_tokenizer([r["input"] + format_answer(r["label"]) for r in rows] + ["Hello world, it's 3.14!"], 300)
    save_tokenizer(tok, tmp_path)
    Qwen2Config(vocab_size=len(tok)).save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert type(loaded).__name__ == "Qwen2Tokenizer"  # the class that rebuilds the pre-tokenizer
    for text in ["12+7=\\boxed{19}", "Hello world, it's 3.14 apples!\n\n ok", "  spaced   out  ", "x=1/2; y=0.5"]:
        assert loaded(text)["input_ids"] == tok(text)["input_ids"], text


def test_builtin_model_is_a_normal_hf_dir(tiny_model_dir, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    n = sum(p.numel() for p in model.parameters())
    assert 2_000_000 < n < 4_000_000, n
    assert model.config.model_type == "qwen2"
    assert tiny_tokenizer.eos_token_id == model.config.eos_token_id


def test_arith_task_deterministic_and_verifiable():
    a, b = BUILTIN_TASKS["arith"].rows()[:50], BUILTIN_TASKS["arith"].rows()[:50]
    assert a == b
    for r in a:
        assert eval(r["input"].rstrip("=")) == int(r["label"])  # noqa: S307 - generated arithmetic only

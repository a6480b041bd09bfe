"""A byte-level BPE tokenizer trained locally in seconds, saved as a normal HF tokenizer.

Trap this module avoids: for ``model_type: qwen2`` AutoTokenizer loads ``Qwen2Tokenizer``, which
rebuilds the pre-tokenizer with Qwen2's split regex. Our tokenizer is trained with exactly that
regex (split, then byte-level without its own regex), so ids are identical after save + reload.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def train_tokenizer(corpus: list[str], vocab_size: int = 512):
    """Train BPE on ``corpus`` and wrap it as a PreTrainedTokenizerFast (Qwen2 conventions)."""
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=EOS, unk_token=None, clean_up_tokenization_spaces=False
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer(tokenizer, path: Path) -> None:
    """Save as Qwen2's tokenizer class so AutoTokenizer of a qwen2 model dir loads it."""
    tokenizer.save_pretrained(path)
    import json

    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    cfg_path.write_text(json.dumps(cfg, indent=2))


def publish_model_dir(model, tokenizer, out: Path, *, qwen2_tokenizer: bool = True) -> Path:
    """Save an HF model dir at ``out`` atomically: written to a sibling temp dir, then renamed. When
    another process published the same build first, its copy is kept (builds are deterministic)."""
    import os
    import shutil

    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    if qwen2_tokenizer:
        save_tokenizer(tokenizer, tmp)
    else:
        tokenizer.save_pretrained(tmp)
    try:
        os.replace(tmp, out)
    except OSError:
        if not (out / "config.json").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return out

"""A tiny random Qwen2 + locally trained tokenizer (built once per session, nothing downloaded) and
factories for in-thread engine servers and clients on 127.0.0.1 (all stopped at teardown).

The model never samples EOS (see never_eos), so every generation runs to max_new_tokens: long
requests for the abort / pause / failover tests are just a large max_new_tokens, deterministically.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from miles_core.models.tokenizer import save_tokenizer, train_tokenizer
from miles_core.rollout.http import HFEngine, HTTPEngineClient, serve_in_thread

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # for `from http_helpers import ...` under any import mode (as tests/rewards does)
    sys.path.insert(0, _HERE)

CORPUS = ["The quick brown fox jumps over the lazy dog.", "2+2=4, 3*3=9, 10-7=3.", "hello world, the answer is 42"] * 4


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One intra-op thread while these tests run (restored after each module): several engines
    share 2 CPUs, and spinning intra-op thread pools slow everyone down."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def never_eos(model, eos_id: int) -> None:
    """Residual dimension 0 is a constant 1 (every embedding has it; no layer writes it), and only
    EOS's lm_head row reads it, with weight -20: after the final RMSNorm h[0] is ~3-5, so the EOS
    logit is ~-60..-100 while the others stay ~0.1: EOS is never sampled (random weights alone
    would sample it once in ~300 tokens, ending "long" requests at random)."""
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[eos_id, 0] = -20.0


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = train_tokenizer(CORPUS, vocab_size=300)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=1024, tie_word_embeddings=False,
        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    path = tmp_path_factory.mktemp("tiny-random-qwen2")
    model = Qwen2ForCausalLM(config)
    never_eos(model, tok.eos_token_id)
    model.save_pretrained(path)
    save_tokenizer(tok, path)
    return path


@pytest.fixture
def make_engine(model_dir):
    def make(batching: str = "exact", **kw):
        return HFEngine.from_pretrained(model_dir, batching=batching, **kw)

    return make


@pytest.fixture
def start_server(make_engine, model_dir):
    """start_server(engine=None, batching="exact", **server_kwargs) -> ServerHandle (fault injection on)."""
    handles = []

    def start(engine=None, batching: str = "exact", **kw):
        kw = {"enable_fault_injection": True, "model_path": str(model_dir), "health_timeout_s": 2.0, **kw}
        handle = serve_in_thread(engine or make_engine(batching), **kw)
        handles.append(handle)
        return handle

    yield start
    for h in handles:
        h.stop()


@pytest.fixture
def make_client():
    """make_client(url, **kw) -> HTTPEngineClient with test-sized timeouts."""
    clients = []

    def make(url: str, **kw):
        c = HTTPEngineClient(url, **{"timeout_s": 30.0, "health_timeout_s": 3.0, "max_retries": 1, "backoff_s": 0.05, **kw})
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.close()

"""dumper_inference on our engine server (SGLang's /dumper/{method}, miles_core/rollout/dumper.py): configured through the router
before a rollout as the reference's configure_sglang does, the engine dumps each forward pass (prefill, then one per
decode step) under <dumper_dir>/engines/engine_<i>/ in SGLang's layout; the prefill's logits are the model's own."""

from __future__ import annotations

import pytest
import torch

from flows.recipes import load_config
from miles_core.rollout.dumper import configure_engines
from miles_core.rollout.http import EngineRouter
from miles_core.rollout.http.client import EngineHTTPError
from miles_core.rollout.protocol import GenerateRequest, SamplingParams


def _files(exp_dir) -> dict[tuple[str, int], dict]:
    out = {}
    for p in exp_dir.glob("*.pt"):
        tags = dict(kv.split("=", 1) for kv in p.stem.split("___"))  # SGLang's dump_loader.parse_meta_from_filename
        out[(tags["name"], int(tags["step"]))] = torch.load(p, weights_only=False)
    return out


def test_the_engine_dumps_every_forward_pass_of_a_rollout(start_server, make_engine, make_client, tmp_path):
    engine = make_engine()
    handle = start_server(engine)
    cfg = load_config("tiny", {"dumper_enable": True, "dumper_dir": str(tmp_path / "d"), "eval_prompt_data": None,
                               "dumper_inference": ["non_intrusive_mode=all", "filter=layer_id is None"]})
    prompt = [5, 6, 7, 8]
    with EngineRouter.from_urls([handle.url]) as router:
        (tmp_path / "d" / "engines" / "stale").mkdir(parents=True)
        configure_engines(cfg, router)  # what Runtime.generate does before each rollout
        assert not (tmp_path / "d" / "engines" / "stale").exists()  # the engines' dir is wiped first
        out = router.generate([GenerateRequest(prompt, SamplingParams(max_new_tokens=3, top_k=1))], seed=1)[0]
    dumps = _files(tmp_path / "d" / "engines" / "engine_0")
    assert sorted({s for _, s in dumps}) == [0, 1, 2]  # prefill + 2 decode forwards for 3 tokens
    assert dumps["input_ids", 0]["value"].tolist() == [prompt]
    assert [dumps["input_ids", s]["value"].flatten().tolist() for s in (1, 2)] == [[t] for t in out.output_ids[:2]]
    client = make_client(handle.url)
    state = client.dumper_control("get_state", {})[0]  # one entry per rank, as SGLang answers
    assert state["step"] == 3 and state["config"]["exp_name"] == "engines/engine_0" and state["config"]["enable"]
    assert client.dumper_control("reset", {}) == [{}] and client.dumper_control("get_state", {})[0]["step"] == 0
    with torch.no_grad():  # hooks off after the reset: this forward dumps nothing
        direct = engine.model(input_ids=torch.tensor([prompt])).logits[:, -1:]  # [1, 1, V]
    logits = dumps["non_intrusive__lm_head.output", 0]["value"]
    assert logits.shape == direct.shape and torch.allclose(logits, direct, atol=1e-5)
    assert int(logits[0, -1].argmax()) == out.output_ids[0]  # top_k 1: the prefill's logits chose the first token
    assert dumps["non_intrusive__lm_head.output", 0]["meta"]["world_size"] == 1

    with pytest.raises(EngineHTTPError, match="unknown dumper control method"):
        client.dumper_control("snapshot", {})
    with pytest.raises(EngineHTTPError, match="server_port is not supported yet"):
        client.dumper_control("configure", {"server_port": "reuse"})


def test_nothing_is_dumped_with_the_inference_phase_off(engine, tmp_path):
    cfg = load_config("tiny", {"dumper_enable": True, "dumper_dir": str(tmp_path / "d"), "eval_prompt_data": None,
                               "dumper_inference": ["enable=false"]})
    configure_engines(cfg, engine)
    engine.generate([GenerateRequest([5, 6], SamplingParams(max_new_tokens=2))], seed=0)
    assert not (tmp_path / "d").exists() and not engine.dumper.options.enable

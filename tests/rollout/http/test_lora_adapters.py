"""LoRA adapters through our SGLang-protocol server, as SGLang 0.5.23 takes them: /load_lora_adapter reads a PEFT dir
(PEFT's own save_pretrained, or the one a weight sync writes), /generate with lora_path runs base + adapter unmerged and
gives, greedy, the tokens of the merged model (W + scale B A) served plainly; a bad dir is a 400 naming what is wrong;
expected_checksums (check_lora_weight_equal) refuses an adapter that is not the sender's; the adapter sync by disk
(WeightSync mode disk, lora_adapter) loads each version's dir; every body we send is SGLang's (the protocol snapshot)."""

from __future__ import annotations

import copy
import json

import httpx
import pytest
import torch

from http_helpers import requests_for
from miles_core.rollout.adapters import ThroughAdapter
from miles_core.rollout.http import EngineRouter, HFEngine, HTTPEngineClient, serve_in_thread, wire
from miles_core.rollout.http.client import EngineHTTPError
from miles_core.rollout.sglang.protocol import Call, request_problems
from miles_core.weights.disk import adapter_checksums, save_adapter_dir
from miles_core.weights.sync import LORA_ADAPTER_NAME, WeightSender, WeightSync, WeightSyncError

R, ALPHA, TARGETS = 4, 8, ["q_proj", "v_proj", "down_proj"]


def _peft(base, seed: int):
    """PEFT's LoRA over a copy of ``base`` with B drawn away from zero (PEFT starts it at 0: the base model)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.normal_(0.0, 0.3)
    return model.eval()


def _payload(peft_model) -> tuple[dict, list[tuple[str, torch.Tensor]]]:
    """(adapter_config.json, adapter_model.safetensors' tensors) of a PEFT model, as the trainer's adapter_tensors gives."""
    from peft import get_peft_model_state_dict

    config = json.loads(json.dumps(peft_model.peft_config["default"].to_dict(), default=sorted))
    return config, sorted((k, v.clone()) for k, v in get_peft_model_state_dict(peft_model).items())  # base_model.model.<module>...


@pytest.fixture(scope="module")
def base(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture
def served(base, tokenizer):
    """A fresh server per test: an engine has one adapter slot, named by its first load."""
    handle = serve_in_thread(HFEngine(copy.deepcopy(base), tokenizer, batching="exact"))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def _greedy(engine, lora: str | None = None):
    requests = requests_for(4, max_new_tokens=6, top_k=1)
    if lora is not None:
        engine = ThroughAdapter(engine, lora)
    return [r.output_ids for r in engine.generate(requests, seed=0)]


def test_a_peft_dir_loaded_by_path_generates_the_merged_models_tokens(base, tokenizer, served, tmp_path):
    adapted = _peft(base, seed=1)
    adapted.save_pretrained(tmp_path / "adapter")  # PEFT's own format: adapter_config.json + adapter_model.safetensors
    merged = HFEngine(copy.deepcopy(adapted).merge_and_unload(), tokenizer, batching="exact")  # W + (alpha / r) B A
    with EngineRouter([HTTPEngineClient(served.url, timeout_s=30.0)]) as router:
        router.slots[0].client.reload_lora_adapter_from_path("peft", str(tmp_path / "adapter"))
        through, plain = _greedy(router, "peft"), _greedy(router)
    assert through == _greedy(merged)  # base + adapter, unmerged, is the merged model
    assert through != plain  # and the adapter changed what is generated (no lora_path: the base)
    assert plain == _greedy(HFEngine(copy.deepcopy(base), tokenizer, batching="exact"))


def test_a_bad_adapter_path_is_a_400_naming_the_path_and_what_is_missing(served, tmp_path):
    def load(path: str) -> httpx.Response:
        return httpx.post(served.url + "/load_lora_adapter", json={"lora_name": "bad", "lora_path": path})

    missing = load(str(tmp_path / "nowhere"))
    assert missing.status_code == 400 and "nowhere" in missing.text and "no such directory" in missing.text
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}')
    half = load(str(tmp_path / "half"))
    assert half.status_code == 400 and "adapter_model.safetensors missing" in half.text
    (tmp_path / "half" / "adapter_model.safetensors").write_bytes(b"not safetensors")
    broken = load(str(tmp_path / "half"))
    assert broken.status_code == 400 and "unreadable adapter" in broken.text
    no_path = httpx.post(served.url + "/load_lora_adapter", json={"lora_name": "bad"})
    assert no_path.status_code == 400 and "lora_path" in no_path.text
    gen = httpx.post(served.url + "/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1},
                                                      "lora_path": "bad"})
    assert gen.status_code == 400 and "no such LoRA adapter" in gen.text


def test_expected_checksums_refuse_an_adapter_that_is_not_the_senders(base, served):
    config, tensors = _payload(_peft(base, seed=2))
    sums = adapter_checksums(tensors)
    client = HTTPEngineClient(served.url, timeout_s=30.0)
    try:
        client.reload_lora_adapter("checked", config, tensors, sums)  # the sender's own: loaded
        wrong = {**sums, tensors[0][0]: "0" * 64}
        with pytest.raises(EngineHTTPError, match=rf"failed its checksum check .*1 tensors differ .*{tensors[0][0]}"):
            client.reload_lora_adapter("checked", config, tensors, wrong)
        with pytest.raises(EngineHTTPError, match="1 extra"):  # a tensor the sender did not list
            client.reload_lora_adapter("checked", config, tensors, dict(list(sums.items())[1:]))
        body = wire.adapter_body("checked", config, tensors, expected_checksums=sums)
        assert request_problems([Call("POST", "/load_lora_adapter_from_tensors", body)]) == []  # SGLang's field
    finally:
        client.close()


def test_the_adapter_sync_by_disk_loads_each_versions_dir_and_serves_the_senders_adapter(base, tokenizer, served, tmp_path):
    """WeightSync(disk, lora_adapter): the sender writes <dir>/lora-v<version> (PEFT format), every engine reloads it by
    /load_lora_adapter; the old version's dir goes; the requests are SGLang's; a check over disk is refused (SGLang's
    /load_lora_adapter has no expected_checksums)."""
    from miles_core.rollout.sglang.protocol import protocol

    adapters = [_peft(base, seed=s) for s in (3, 4)]
    current = {"model": adapters[0]}
    sender = WeightSender(lambda: [], adapter=lambda: _payload(current["model"]))
    sync = WeightSync("disk", 1 << 20, tmp_path / "weight_sync", lora_adapter=True)
    calls: list[Call] = []
    client = HTTPEngineClient(served.url, timeout_s=30.0)
    client._http.event_hooks["request"].append(lambda r: calls.append(Call(r.method, r.url.path, json.loads(r.read() or b"null"))))
    try:
        with EngineRouter([client]) as router:
            for version, model in enumerate(adapters, start=1):
                current["model"] = model
                sync.sync(sender, router, version)
                merged = HFEngine(copy.deepcopy(model).merge_and_unload(), tokenizer, batching="exact")
                assert _greedy(router, LORA_ADAPTER_NAME) == _greedy(merged)
            assert sorted(p.name for p in (tmp_path / "weight_sync").iterdir()) == ["lora-v2"]
        loads = [c for c in calls if c.path == "/load_lora_adapter"]
        assert [c.body for c in loads] == [{"lora_name": LORA_ADAPTER_NAME, "lora_path": str(tmp_path / "weight_sync" / f"lora-v{v}")}
                                           for v in (1, 2)]
        assert request_problems(calls) == []  # every route, method and field is SGLang 0.5.23's
        assert set(protocol()["requests"]["LoadLoRAAdapterReqInput"]) >= {"lora_name", "lora_path"}
        with pytest.raises(ValueError, match="no expected_checksums"):
            WeightSync("disk", 1 << 20, tmp_path, lora_adapter=True, check_adapter=True)
    finally:
        client.close()


def test_a_sync_whose_engine_refuses_the_checksums_fails_naming_the_tensor(base, served, monkeypatch):
    """check_lora_weight_equal end to end: digests that are not those of the tensors sent (what a corrupt transfer
    gives) fail the sync, naming the tensors; the engine keeps its version."""
    config, tensors = _payload(_peft(base, seed=5))

    class Corrupting(WeightSender):
        def adapter(self):
            return config, tensors

    sync = WeightSync("tensor", 1 << 20, lora_adapter=True, check_adapter=True)
    from miles_core.weights import disk

    honest = disk.adapter_checksums
    with EngineRouter([HTTPEngineClient(served.url, timeout_s=30.0)]) as router:
        sync.sync(Corrupting(lambda: []), router, 7)  # the same tensors hashed and sent: loaded
        monkeypatch.setattr(disk, "adapter_checksums", lambda named: honest([(n, t + 1) for n, t in named]))
        with pytest.raises(WeightSyncError, match=r"version 8 .*failed its checksum check"):  # the sender's digests of
            sync.sync(Corrupting(lambda: []), router, 8)  # other tensors (the engine hashes what it got itself)
        assert router.slots[0].client.get_weight_version() == 7  # the engine kept its version
        assert not router.slots[0].healthy  # and left the router, as after any failed sync (restarted at the next)


def test_the_in_process_adapter_sync_checks_the_digests_too(base, tokenizer, monkeypatch):
    """The local runtime's path (InProcessFleet, check_lora_weight_equal): the same check on the engine in process."""
    from miles_core.rollout.adapters import AdapterError
    from miles_core.rollout.fleet import InProcessFleet
    from miles_core.weights import disk

    adapted = _peft(base, seed=6)
    engine = HFEngine(copy.deepcopy(base), tokenizer, batching="exact")
    fleet = InProcessFleet(engine, 1 << 20, lora_adapter=True, check_adapter=True)

    class Source:
        def adapter(self):
            return _payload(adapted)

    fleet.update_weights(Source(), 1)
    assert _greedy(fleet.engine) == _greedy(HFEngine(copy.deepcopy(adapted).merge_and_unload(), tokenizer, batching="exact"))
    honest = disk.adapter_checksums
    monkeypatch.setattr(disk, "adapter_checksums", lambda named: honest([(n, t * 2) for n, t in named]))
    with pytest.raises(AdapterError, match="failed its checksum check"):
        fleet.update_weights(Source(), 2)
    assert engine.weight_version == 1

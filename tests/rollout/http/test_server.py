"""Contract tests of every endpoint of our server, raw HTTP (httpx) against a real server on 127.0.0.1."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import torch

from miles_core.rollout.http.engine import request_seed

from http_helpers import requests_for


def post(handle, path, json=None, **kw):
    return httpx.post(handle.url + path, json=json, timeout=30, **kw)


def get(handle, path, **kw):
    return httpx.get(handle.url + path, timeout=30, **kw)


def wait_until(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def in_background(fn):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("value", fn()), daemon=True)
    t.start()
    return t, out


def test_generate_single_and_batch_shapes(start_server):
    h = start_server()
    single = post(h, "/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}, "return_logprob": True})
    assert single.status_code == 200
    body = single.json()
    assert set(body) == {"text", "output_ids", "meta_info"}
    meta = body["meta_info"]
    assert meta["finish_reason"] in ({"type": "length", "length": 4}, {"type": "stop", "matched": body["output_ids"][-1]})
    assert meta["prompt_tokens"] == 3 and meta["completion_tokens"] == len(body["output_ids"]) and meta["cached_tokens"] == 0
    assert meta["weight_version"] == "0"
    assert [e[1] for e in meta["output_token_logprobs"]] == body["output_ids"]
    assert all(e[0] <= 0 and e[2] is None for e in meta["output_token_logprobs"])
    batch = post(h, "/generate", {"input_ids": [[5, 6], [7, 8, 9]], "sampling_params": {"max_new_tokens": 3}}).json()
    assert isinstance(batch, list) and len(batch) == 2
    assert "output_token_logprobs" not in batch[0]["meta_info"]  # only with return_logprob


def test_seeds_sampling_seed_and_top_level_seed(start_server):
    h = start_server()
    sp = {"max_new_tokens": 6}
    by_top = post(h, "/generate", {"input_ids": [[5, 6], [5, 6]], "sampling_params": sp, "seed": 9}).json()
    by_each = post(h, "/generate", {"input_ids": [[5, 6], [5, 6]], "sampling_params": [
        {**sp, "sampling_seed": request_seed(9, 0)}, {**sp, "sampling_seed": request_seed(9, 1)}]}).json()
    assert [r["output_ids"] for r in by_top] == [r["output_ids"] for r in by_each]
    assert by_top[0]["output_ids"] != by_top[1]["output_ids"]  # same prompt, different seeds
    again = post(h, "/generate", {"input_ids": [5, 6], "sampling_params": {**sp, "sampling_seed": request_seed(9, 1)}}).json()
    assert again["output_ids"] == by_top[1]["output_ids"]


@pytest.mark.parametrize("body, needle", [
    ({"text": "hi"}, "input_ids"),
    ({"input_ids": [5, 10**6]}, "token ids"),
    ({"input_ids": [5], "sampling_params": {"temperature": 0}}, "temperature"),
    ({"input_ids": [5], "sampling_params": {"frequency_penalty": 0.5}}, "frequency_penalty"),
    ({"input_ids": [5], "sampling_params": {"bogus": 1}}, "bogus"),
    ({"input_ids": [[5], [6]], "sampling_params": [{}]}, "sampling_params"),
])
def test_generate_rejects_bad_requests_with_400(start_server, body, needle):
    r = post(start_server(), "/generate", body)
    assert r.status_code == 400 and needle in r.json()["message"]


def test_health_flush_info_and_versions(start_server, model_dir):
    h = start_server()
    assert get(h, "/health_generate").status_code == 200 and get(h, "/health").status_code == 200
    assert get(h, "/flush_cache").status_code == 200 and post(h, "/flush_cache").status_code == 200
    assert get(h, "/model_info").json()["weight_version"] == "0"  # SGLang serves the version here (no /get_weight_version)
    r = post(h, "/update_weight_version", {"new_version": "7"}).json()
    assert r["success"] and r["new_version"] == "7"
    assert post(h, "/update_weight_version", {"weight_version": 8}).status_code == 400  # not SGLang's field
    assert get(h, "/get_weight_version").status_code == 404
    assert post(h, "/update_weight_version", {"new_version": "v2"}).status_code == 400
    want = {"model_path": str(model_dir), "is_generation": True, "weight_version": "7"}
    assert get(h, "/model_info").json() == want and get(h, "/get_model_info").json() == want  # and SGLang's old name
    info = get(h, "/server_info").json()
    assert info["server"] == "miles-hf" and info["batching"] == "exact" and info["stats"]["queued"] == 0 and info["tp_size"] == 1


def test_abort_all_finishes_in_flight_and_queued_requests_with_abort(start_server):
    h = start_server()  # exact batching: one request runs, the other waits in the queue
    long = {"input_ids": [[5, 6, 7], [8, 9]], "sampling_params": {"max_new_tokens": 900}, "return_logprob": True}
    t, out = in_background(lambda: post(h, "/generate", long).json())
    wait_until(lambda: get(h, "/get_server_info").json()["stats"]["running"] == 1)
    assert post(h, "/abort_request", {"abort_all": True}).json()["num_aborted"] == 2
    t.join(10)
    running, queued = out["value"]
    assert running["meta_info"]["finish_reason"]["type"] == "abort" and 0 < len(running["output_ids"]) < 900
    assert len(running["meta_info"]["output_token_logprobs"]) == len(running["output_ids"])
    assert queued["meta_info"]["finish_reason"]["type"] == "abort" and queued["output_ids"] == []


def test_pause_holds_new_requests_and_continue_releases_them(start_server):
    h = start_server()
    assert post(h, "/pause_generation", {"mode": "retract"}).json()["status"] == "ok"
    t, out = in_background(lambda: post(h, "/generate", {"input_ids": [5], "sampling_params": {"max_new_tokens": 3}}).json())
    wait_until(lambda: get(h, "/get_server_info").json()["stats"]["queued"] == 1)
    post(h, "/update_weight_version", {"new_version": "1", "abort_all_requests": False})  # engine calls still run while paused
    time.sleep(0.2)
    assert t.is_alive() and get(h, "/get_server_info").json()["paused"]
    assert post(h, "/continue_generation").json()["status"] == "ok"
    t.join(10)
    assert out["value"]["meta_info"]["weight_version"] == "1"  # generated after the update


def test_pause_mode_abort_aborts_in_flight(start_server):
    h = start_server()
    t, out = in_background(lambda: post(h, "/generate", {"input_ids": [5], "sampling_params": {"max_new_tokens": 900}}).json())
    wait_until(lambda: get(h, "/get_server_info").json()["stats"]["running"] == 1)
    post(h, "/pause_generation", {"mode": "abort"})
    t.join(10)
    assert out["value"]["meta_info"]["finish_reason"]["type"] == "abort"
    post(h, "/continue_generation")


def test_release_and_resume_memory(start_server):
    h = start_server()
    assert post(h, "/release_memory_occupation", {"tags": ["kv_cache"]}).json()["released"] == ["kv_cache"]
    assert get(h, "/health_generate").status_code == 503
    r = post(h, "/generate", {"input_ids": [5]})
    assert r.status_code == 503 and "resume_memory_occupation" in r.json()["message"]
    assert post(h, "/release_memory_occupation", {"tags": ["bogus"]}).status_code == 400
    assert post(h, "/resume_memory_occupation", {"tags": ["kv_cache"]}).json()["released"] == []
    post(h, "/release_memory_occupation")  # no body = every tag
    assert post(h, "/resume_memory_occupation").json()["released"] == []
    r = post(h, "/generate", {"input_ids": [5]})  # CPU weights were dropped and are not written yet
    assert r.status_code == 503 and "not written" in r.json()["message"]
    assert post(h, "/update_weights_from_disk", {"model_path": h.server.options.model_path}).status_code == 200
    assert post(h, "/generate", {"input_ids": [5], "sampling_params": {"max_new_tokens": 2}}).status_code == 200


def test_a_weights_cpu_backup_release_keeps_the_weights_and_the_resume_serves_them_unsynced(start_server):
    """--enable-weights-cpu-backup (lora_base_cpu_backup's engine side): the released weights come back bit for bit, so
    generation needs no weight update after the resume (without it: 503 'not written', the test above)."""
    h = start_server(weights_cpu_backup=True)
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 4}, "return_logprob": True, "seed": 7}
    before = post(h, "/generate", body)
    assert before.status_code == 200, before.text
    before = before.json()
    params = dict(h.server.engine.model.named_parameters())
    kept = {n: p.detach().clone() for n, p in params.items()}
    post(h, "/release_memory_occupation")
    assert all(p.numel() == 0 for p in params.values())  # released: the model holds no weights
    assert post(h, "/resume_memory_occupation").json()["released"] == []
    assert all(torch.equal(p, kept[n]) for n, p in h.server.engine.model.named_parameters())
    after = post(h, "/generate", body)
    assert after.status_code == 200 and after.json()["output_ids"] == before["output_ids"]
    assert after.json()["meta_info"]["output_token_logprobs"] == before["meta_info"]["output_token_logprobs"]


def test_weights_from_tensor_takes_safetensors_only(start_server):
    h = start_server()
    post(h, "/begin_weight_update", {})
    r = post(h, "/update_weights_from_tensor", {"serialized_named_tensors": ["..."]})
    assert r.status_code == 400 and "safetensors" in r.json()["message"]
    r = httpx.post(h.url + "/update_weights_from_tensor", content=b"not safetensors",
                   headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 400


def test_fault_injection_switch(start_server):
    assert post(start_server(enable_fault_injection=False), "/debug/fail", {"mode": "error"}).status_code == 404
    h = start_server()
    assert post(h, "/debug/fail", {"mode": "explode"}).status_code == 400
    post(h, "/debug/fail", {"mode": "error"})
    assert get(h, "/health_generate").status_code == 500 and get(h, "/model_info").status_code == 500
    post(h, "/debug/fail", {"mode": "none"})
    assert get(h, "/health_generate").status_code == 200
    post(h, "/debug/fail", {"mode": "error", "on": "generate"})
    assert post(h, "/generate", {"input_ids": [5]}).status_code == 500 and get(h, "/health_generate").status_code == 200
    post(h, "/debug/fail", {"mode": "crash"})
    time.sleep(0.2)
    with pytest.raises(httpx.TransportError):
        get(h, "/health_generate")


def test_shards_outside_the_model_dir_are_refused_with_400_naming_the_path(start_server, tmp_path):
    import json

    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../../etc/passwd"}}))
    r = post(start_server(), "/update_weights_from_disk", {"model_path": str(tmp_path)})
    assert r.status_code == 400
    assert "outside the model dir" in r.json()["message"] and "../../etc/passwd" in r.json()["message"]


def test_a_server_without_api_key_warns_at_startup(start_server, caplog):
    with caplog.at_level("WARNING", logger="miles_core.rollout.http.server"):
        start_server()
    assert any("has no API key" in r.getMessage() and "--api-key" in r.getMessage() for r in caplog.records)

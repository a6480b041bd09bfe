"""Our engine server's GET /metrics (--enable-metrics) against SGLang 0.5.23's own metric definitions
(rollout/sglang/metrics.json, read from the wheel's metrics_collector.py by tools/sglang_metrics.py): the same names,
kinds, help texts and label names; values that follow what the server did."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from miles_core.rollout.http import HTTPEngineClient
from miles_core.rollout.http.engine import HFEngine
from miles_core.rollout.http.launch import serve_in_thread
from miles_core.rollout.http.metrics import COUNTERS, GAUGES
from miles_core.rollout.protocol import GenerateRequest, SamplingParams
from miles_core.rollout.sglang.protocol import route_problems

SNAPSHOT = json.loads((Path(__file__).parents[3] / "miles_core" / "rollout" / "sglang" / "metrics.json").read_text())


@pytest.fixture(scope="module")
def servers(tiny_model_dir, one_torch_thread):
    on = serve_in_thread(HFEngine.from_pretrained(tiny_model_dir, batching="exact"), model_path="tiny", enable_metrics=True)
    off = serve_in_thread(HFEngine.from_pretrained(tiny_model_dir, batching="exact"))
    yield on, off
    on.stop()
    off.stop()


def _families(url: str) -> dict:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_have_sglangs_names_kinds_help_and_labels(servers):
    on, _ = servers
    fams = _families(on.url)
    sglang = SNAPSHOT["metrics"]
    assert SNAPSHOT["sglang_version"] == "0.5.23"
    for name, doc in {**GAUGES, **COUNTERS}.items():
        assert name in sglang and sglang[name]["documentation"] == doc
        fam = fams[name.removesuffix("_total") if sglang[name]["kind"] == "counter" else name]
        assert fam.type == sglang[name]["kind"] and fam.documentation == doc
        labels = SNAPSHOT["label_dicts"]["init_new" if name in GAUGES else "tokenizer_metric_labels"]
        extra = ["is_streaming"] if "is_streaming" in (sglang[name]["labelnames"] or "") else []
        assert sglang[name]["labelnames"] in ("labels.keys()", "list(labels.keys()) + ['is_streaming']")
        assert sorted(fam.samples[0].labels) == sorted(labels + extra)
        assert fam.samples[0].labels["engine_type"] == "unified" and fam.samples[0].labels["model_name"] == "tiny"


def test_counters_follow_the_requests_served(servers):
    on, _ = servers
    before = {s.name: s.value for f in _families(on.url).values() for s in f.samples}
    client = HTTPEngineClient(on.url)
    res = client.generate_seeded([GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=4)) for _ in range(2)], [1, 2])
    client.close()
    after = {s.name: s.value for f in _families(on.url).values() for s in f.samples}
    assert after["sglang:num_requests_total"] - before["sglang:num_requests_total"] == 2
    assert after["sglang:prompt_tokens_total"] - before["sglang:prompt_tokens_total"] == 6
    assert after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"] == sum(len(r.output_ids) for r in res)
    assert after["sglang:gen_throughput"] > 0 and after["sglang:num_running_reqs"] == 0 and after["sglang:num_queue_reqs"] == 0


def test_metrics_only_with_enable_metrics_and_it_is_an_sglang_route(servers):
    _, off = servers
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(off.url + "/metrics", timeout=10)
    assert e.value.code == 404
    assert route_problems([(("GET",), "/metrics")]) == []

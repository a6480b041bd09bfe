"""``GET /metrics`` of our engine server (--enable-metrics, as SGLang's flag): Prometheus text, SGLang's metric names.

SGLang 0.5.23 mounts prometheus_client's app at /metrics when started with --enable-metrics
(``utils/common.py::add_prometheus_middleware``); its scheduler's gauges carry the labels model_name, engine_type,
tp_rank, pp_rank, moe_ep_rank, its tokenizer's counters model_name, engine_type and is_streaming
(``observability/metrics_collector.py``, snapshot: rollout/sglang/metrics.json, held by tests/rollout/http/test_metrics.py).
We serve the ones this server measures, with SGLang's names, kinds, help texts and label names:

    sglang:num_running_reqs          requests in the batch the engine is generating now
    sglang:num_queue_reqs            requests waiting for a batch
    sglang:gen_throughput            generated tokens / s of the batches finished in the last THROUGHPUT_WINDOW_S seconds
    sglang:num_requests_total        requests answered
    sglang:prompt_tokens_total       their prompt tokens
    sglang:generation_tokens_total   their generated tokens

Not served (no counterpart in an HF engine): the KV-pool gauges (token_usage, num_used_tokens, ...), cache_hit_rate
(no prefix cache), the speculative, PD, LoRA-pool and grammar families. A scraper filtering on them finds nothing.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

THROUGHPUT_WINDOW_S = 10.0
ENGINE_TYPE = "unified"  # SGLang's DisaggregationMode.to_engine_type of no PD mode
GAUGES = {
    "sglang:num_running_reqs": "The number of running requests.",
    "sglang:num_queue_reqs": "The number of requests in the waiting queue.",
    "sglang:gen_throughput": "The generation throughput (token/s).",
}
COUNTERS = {
    "sglang:num_requests_total": "Number of requests processed.",
    "sglang:prompt_tokens_total": "Number of prefill tokens processed.",
    "sglang:generation_tokens_total": "Number of generation tokens processed.",
}
SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOKENIZER_LABELS = ("model_name", "engine_type", "is_streaming")


@dataclass
class GenerationCounts:
    """What the batcher has answered (updated on the event loop, read by /metrics)."""

    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: deque = field(default_factory=deque)  # (monotonic end of a batch, its generated tokens, its seconds)

    def add_batch(self, prompt_tokens: int, generated: int, requests: int, seconds: float) -> None:
        self.requests += requests
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += generated
        self.finished.append((time.monotonic(), generated, seconds))

    def throughput(self) -> float:
        """Tokens per second of engine time over the batches finished in the last window (0 when none)."""
        horizon = time.monotonic() - THROUGHPUT_WINDOW_S
        while self.finished and self.finished[0][0] < horizon:
            self.finished.popleft()
        seconds = sum(s for _, _, s in self.finished)
        return sum(n for _, n, _ in self.finished) / seconds if seconds > 0 else 0.0


def render(model_name: str, running: int, queued: int, counts: GenerationCounts) -> bytes:
    """The Prometheus text exposition (prometheus_client's, as SGLang's) of this server's metrics now."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    sched = [model_name, ENGINE_TYPE, "0", "0", "0"]
    tok = [model_name, ENGINE_TYPE, "false"]
    gauges = {"sglang:num_running_reqs": running, "sglang:num_queue_reqs": queued, "sglang:gen_throughput": counts.throughput()}
    counters = {"sglang:num_requests_total": counts.requests, "sglang:prompt_tokens_total": counts.prompt_tokens,
                "sglang:generation_tokens_total": counts.generation_tokens}

    class Collector:
        def collect(self):
            for name, value in gauges.items():
                g = GaugeMetricFamily(name, GAUGES[name], labels=SCHEDULER_LABELS)
                g.add_metric(sched, float(value))
                yield g
            for name, value in counters.items():
                c = CounterMetricFamily(name.removesuffix("_total"), COUNTERS[name], labels=TOKENIZER_LABELS)
                c.add_metric(tok, float(value))
                yield c

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    return generate_latest(registry)

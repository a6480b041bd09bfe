"""The engines' SGLang metrics for the dashboard: every ``dashboard_sglang_scrape_interval`` seconds, ``GET <engine>/metrics``
of every HTTP engine of the run (SGLang serves it with --enable-metrics; so does our engine server,
rollout/http/metrics.py), parsed as Prometheus text, kept by name, one EngineSample per series.

As the reference's SglangScraper (miles/dashboard/sglang_scraper.py) in its direct mode: a family's name is compared
with ':' read as '_' (SGLang's ``sglang:num_running_reqs`` is ``sglang_num_running_reqs``), against
dashboard_sglang_metrics or ``DEFAULT_METRICS``; of the labels only ``engine_type`` is kept (prefill / decode /
unified). Ours also keeps a sample whose own name is listed: a counter's family is ``sglang_generation_tokens`` in
Prometheus' parser, its sample ``sglang_generation_tokens_total`` - either name selects it (the reference: the
family's only); a sample is recorded under its own name, a family's ``_created`` samples are left out. A failed engine leaves a gap for that scrape (never a made-up value) and a rate-limited warning. The
engine list is asked for at every scrape: an engine restarted on another port is followed. The router mode (one
``GET <router>/engine_metrics``) has no counterpart: miles' router is in-process (refused at load).
"""

from __future__ import annotations

import logging
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable

from .samplers import RateLimitedLog
from .store import EngineSample

log = logging.getLogger(__name__)

# the reference's DEFAULT_METRIC_WHITELIST (sglang_scraper.py): the PD ones exist only with PD disaggregation
DEFAULT_METRICS = (
    "sglang_num_running_reqs", "sglang_num_queue_reqs", "sglang_gen_throughput", "sglang_token_usage",
    "sglang_cache_hit_rate", "sglang_num_prefill_prealloc_queue_reqs", "sglang_num_prefill_inflight_queue_reqs",
    "sglang_num_decode_prealloc_queue_reqs", "sglang_num_decode_transfer_queue_reqs", "sglang_kv_transfer_speed_gb_s",
    "sglang_kv_transfer_latency_ms",
)
KEPT_LABELS = ("engine_type",)


def http_get(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (the run's own engine URLs)
        return r.read().decode()


class EngineScraper:
    def __init__(self, engine_urls: Callable[[], Iterable[str]], names: Iterable[str] = DEFAULT_METRICS, timeout: float = 5.0,
                 get: Callable[[str, float], str] = http_get):
        self.engine_urls, self.names, self.timeout, self.get = engine_urls, frozenset(names), timeout, get
        self.warn = RateLimitedLog(log)

    def scrape(self, ts: float) -> list[EngineSample]:
        urls = list(self.engine_urls())
        if not urls:
            return []
        with ThreadPoolExecutor(min(8, len(urls)), thread_name_prefix="miles-dashboard-scrape") as pool:
            texts = list(pool.map(self._fetch, urls))
        return [s for url, text in zip(urls, texts) if text is not None for s in self.parse(url, text, ts)]

    def _fetch(self, url: str) -> str | None:
        try:
            return self.get(url.rstrip("/") + "/metrics", self.timeout)
        except Exception as e:  # a dead or restarting engine: a gap in its series
            self.warn.warning("scrape of engine %s/metrics failed (%s); a gap this scrape (is it serving --enable-metrics?)", url, e)
            return None

    def parse(self, addr: str, text: str, ts: float) -> list[EngineSample]:
        from prometheus_client.parser import text_string_to_metric_families

        out = []
        for family in text_string_to_metric_families(text):
            whole = family.name.replace(":", "_") in self.names
            for s in family.samples:
                name = s.name.replace(":", "_")
                if not (name in self.names or whole and not name.endswith("_created")):
                    continue
                labels = {k: v for k, v in s.labels.items() if k in KEPT_LABELS}
                out.append(EngineSample(ts=ts, addr=addr, metric=name, labels=labels, value=float(s.value)))
        return out

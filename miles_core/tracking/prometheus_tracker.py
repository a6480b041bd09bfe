"""Prometheus mirror: the latest value of every logged metric as a gauge on ``/metrics``
(http://<prometheus_host>:<prometheus_port>, 127.0.0.1 unless told otherwise), for the run's life.

Gauge names: ``miles_`` + the key with every character outside [A-Za-z0-9_] as ``_``
(``rollout/raw_reward`` -> ``miles_rollout_raw_reward``), labelled with the MLflow run id and the run
name (prometheus_run_name, default the MLflow run's); the help text is the metric's catalog meaning. A private
registry (not prometheus_client's global one), so two runs in one process serve only their own metrics. No history: nothing to resume.
"""

from __future__ import annotations

import re

from .catalog import match
from .keys import sanitize_key

_INVALID = re.compile(r"[^A-Za-z0-9_]")
LABELS = ("run_id", "run_name")


def gauge_name(key: str) -> str:
    return "miles_" + _INVALID.sub("_", key)


class PrometheusMirror:
    name = "prometheus"

    def __init__(self, host: str, port: int, labels: dict[str, str]):
        from prometheus_client import CollectorRegistry, start_http_server

        self.registry = CollectorRegistry(auto_describe=True)
        self.labels = labels
        self.marks: dict[str, int] = {}
        self._gauges: dict[str, object] = {}
        try:
            self.server, self.thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:
            raise OSError(f"prometheus_port {port} on prometheus_host {host}: cannot serve /metrics ({e}); "
                          "choose another port (0 picks a free one) or turn use_prometheus off") from None
        self.link = f"http://{host}:{self.server.server_port}/metrics"

    @classmethod
    def open(cls, spec) -> "PrometheusMirror":
        t = spec.tracking
        return cls(t.prometheus_host, t.prometheus_port, {"run_id": spec.mlflow_run_id, "run_name": t.prometheus_run_name or spec.run_name})

    def log(self, metrics: dict[str, float], axis: str, step: int) -> None:
        self.set_gauges(metrics)

    log_extra = log

    def set_gauges(self, metrics: dict[str, float]) -> None:
        """The latest values, at no step (the dashboard's forwarded samples: dashboard_forward_prometheus)."""
        for key, value in metrics.items():
            self._gauge(key).labels(**self.labels).set(float(value))

    def _gauge(self, key: str):
        from prometheus_client import Gauge

        name = gauge_name(key)
        if name not in self._gauges:
            entry = match(key)
            self._gauges[name] = Gauge(name, f"{sanitize_key(key)}: {entry.meaning if entry else 'a miles metric'}", LABELS, registry=self.registry)
        return self._gauges[name]

    def flush(self) -> None:
        """Gauges are read live by the scraper."""

    def close(self, status: str) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

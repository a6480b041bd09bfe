"""The dashboard fields' cross-field rules (config/tracking.py; docs/guide/trackers.md#dashboard), checked by
rules.check_rules. The reference asserts the same at start-up (miles/dashboard/args.py validate_dashboard_args)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .train import TrainConfig

DASHBOARD_OPTIONS = ("dashboard_flush_interval", "dashboard_gpu_sample_interval", "dashboard_sglang_scrape_interval",
                     "dashboard_sglang_scrape_mode", "dashboard_sglang_metrics", "dashboard_forward_prometheus")
NO_ROUTER_METRICS = ("miles' router is an in-process object (rollout/http/router.py), not an SGLang router with an "
                     "/engine_metrics endpoint to fan out to the engines; use direct (or auto, which is direct here)")


def dashboard_rules(c: "TrainConfig") -> None:
    t = c.tracking
    if not t.use_miles_dashboard:
        fields = type(t).model_fields
        set_ = [n for n in DASHBOARD_OPTIONS if getattr(t, n) != fields[n].default]
        if set_:
            verb = "applies" if len(set_) == 1 else "apply"
            raise ValueError(f"{', '.join(set_)} {verb} only with use_miles_dashboard (off); set use_miles_dashboard or drop it")
        return
    if t.dashboard_sglang_scrape_mode == "router":
        raise ValueError(f"dashboard_sglang_scrape_mode router is not supported yet ({NO_ROUTER_METRICS})")
    if t.dashboard_sglang_metrics is not None and not t.dashboard_metric_names:
        raise ValueError(f"dashboard_sglang_metrics {t.dashboard_sglang_metrics!r} names no metric; give comma-separated "
                         "names (sglang_num_running_reqs,sglang_gen_throughput) or drop it for the default list")
    if t.dashboard_forward_prometheus and not t.use_prometheus:
        raise ValueError("dashboard_forward_prometheus sets gauges on the Prometheus endpoint, which is off: set use_prometheus, "
                         "or drop it")

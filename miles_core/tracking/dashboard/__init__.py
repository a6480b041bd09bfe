"""The run's telemetry dashboard (use_miles_dashboard; the reference's miles/dashboard, docs/guide/trackers.md#dashboard).

    collector.py  DashboardMirror: a tracker mirror (tracking/fanout.py MIRRORS) that owns the threads below
    samplers.py   GPU samples (NVML, else torch.cuda memory) or, with no GPU, host samples, every gpu_sample_interval
    scraper.py    the HTTP engines' SGLang /metrics, every sglang_scrape_interval, filtered by metric name
    store.py      append-only JSONL streams under <run_dir>/dashboard/, flushed every flush_interval
    server.py     ``miles dashboard <run_dir>``: the streams as JSON over HTTP on 127.0.0.1
"""

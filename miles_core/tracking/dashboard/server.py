"""``miles dashboard <run_dir>``: a run's dashboard files (store.py) as JSON over HTTP, on 127.0.0.1 unless told otherwise.

    GET /                      what is here: the run dir, each stream's record count, the endpoints
    GET /api/meta              meta.json (run, sampler, scrape mode, metric names, intervals)
    GET /api/latest            the newest record of each series: per axis, per GPU (or the host), per engine and metric
    GET /api/<stream>          a stream's records (metrics, gpu_util, host, engine_series); ?since=<ts> (records
                               after it: a client polls with its last ts, as the reference's --follow) and ?limit=<n>

Reads the files at every request, so it serves a running run as well as a finished one. The reference serves a
JavaScript app over FastAPI (miles/dashboard/serve.py, server.py); ours is the JSON only (curl, a notebook, Grafana's
JSON data source). A missing stream or bad parameter answers 404 / 400 with a JSON error, as the reference's API.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from .store import STREAMS, read_meta, read_stream


def latest(root: Path) -> dict:
    series = {"metrics": lambda r: r["axis"], "gpu_util": lambda r: f"{r['node']}:{r['gpu']}",
              "host": lambda r: r["node"], "engine_series": lambda r: f"{r['addr']} {r['metric']}"}
    out = {}
    for stream, key in series.items():
        newest: dict[str, dict] = {}
        for r in read_stream(root, stream):
            newest[key(r)] = r
        out[stream] = newest
    return out


class _Handler(BaseHTTPRequestHandler):
    root: Path  # set on the subclass make_server builds

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        url = urlparse(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        path = url.path.rstrip("/") or "/"
        try:
            if path == "/":
                body = {"run_dir": str(self.root.parent), "streams": {s: len(read_stream(self.root, s)) for s in STREAMS},
                        "endpoints": ["/api/meta", "/api/latest"] + [f"/api/{s}?since=<ts>&limit=<n>" for s in STREAMS]}
            elif path == "/api/meta":
                body = read_meta(self.root)
            elif path == "/api/latest":
                body = latest(self.root)
            elif path.startswith("/api/") and path.removeprefix("/api/") in STREAMS:
                since = float(q["since"]) if "since" in q else None
                limit = int(q["limit"]) if "limit" in q else None
                body = read_stream(self.root, path.removeprefix("/api/"), since, limit)
            else:
                return self._send(404, {"error": f"no {path}; see / for the endpoints"})
        except ValueError as e:
            return self._send(400, {"error": f"bad parameter: {e}"})
        self._send(200, body)

    def _send(self, status: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args) -> None:
        """Quiet: one line per request would drown the console."""


def make_server(run_dir: Path, host: str = "127.0.0.1", port: int = 7788) -> ThreadingHTTPServer:
    """The server over ``<run_dir>/dashboard`` (not started: ``serve_forever()``; port 0 picks a free one)."""
    root = Path(run_dir) / "dashboard"
    if not (root / "meta.json").is_file():
        raise FileNotFoundError(f"{run_dir} has no dashboard (no {root / 'meta.json'}): train with use_miles_dashboard "
                                "(--use-miles-dashboard) to collect one")
    handler = type("DashboardHandler", (_Handler,), {"root": root})
    return ThreadingHTTPServer((host, port), handler)

"""remote_rm against a real HTTP server on 127.0.0.1 (no mocks): success, timeouts, retries, errors."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from miles_core.data.sample import Sample
from miles_core.rewards import RewardOptions, async_rm, batched_async_rm
from miles_core.rewards import remote_rm
from miles_core.rewards.remote_rm import RemoteRewardError, backoff_seconds


class _Handler(BaseHTTPRequestHandler):
    """Routes: /len, /dict, /slow-once, /fail-twice, /always-500, /not-json, /list, /nan, /nan-dict, /bad-request."""

    def log_message(self, *args):  # keep test output quiet
        return None

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server = self.server
        with server.lock:
            server.hits[self.path] += 1
            hits = server.hits[self.path]
            server.bodies.append(body)
        status, text = self._route(body, hits)
        self._reply(status, text)

    def _route(self, body, hits):
        if self.path == "/len":
            return 200, json.dumps(len(body["response"]))
        if self.path == "/dict":
            return 200, json.dumps({"score": 1.0, "label": body["label"]})
        if self.path == "/slow-once":
            if hits == 1:
                time.sleep(0.6)
            return 200, "0.25"
        if self.path == "/fail-twice":
            return (500, "overloaded") if hits <= 2 else (200, "0.5")
        if self.path == "/always-500":
            return 500, "boom"
        if self.path == "/not-json":
            return 200, "hello"
        if self.path == "/list":
            return 200, "[1, 2]"
        if self.path == "/nan":
            return 200, "NaN"
        if self.path == "/nan-dict":
            return 200, '{"score": Infinity}'
        return 400, "bad request"

    def _reply(self, status, text):
        data = text.encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            return  # the client gave up (timeout test): nothing to answer


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default backlog of 5 would stall concurrent connects


@pytest.fixture(scope="module")
def server():
    httpd = _Server(("127.0.0.1", 0), _Handler)
    httpd.lock = threading.Lock()
    httpd.hits = Counter()
    httpd.bodies = []
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(remote_rm, "BACKOFF_BASE_S", 0.02)


def url(server, path):
    return f"http://127.0.0.1:{server.server_address[1]}{path}"


def score_remote(server, path, sample=None, **kwargs):
    opts = RewardOptions(rm_type=kwargs.pop("rm_type", "remote_rm"), rm_url=url(server, path), **kwargs)
    return asyncio.run(async_rm(sample or Sample(prompt="p", response="abc", label="L"), opts))


def test_float_reward_and_payload(server):
    assert score_remote(server, "/len") == 3.0
    assert server.bodies[-1] == {"prompt": "p", "response": "abc", "label": "L"}


def test_dict_reward(server):
    assert score_remote(server, "/dict") == {"score": 1.0, "label": "L"}


def test_boxed_prefix_posts_the_boxed_content(server):
    sample = Sample(prompt="p", response=r"long text \boxed{42}", label="42")
    assert score_remote(server, "/len", sample, rm_type="boxed_remote_rm") == 2.0


def test_slow_reply_times_out_then_the_retry_succeeds(server):
    assert score_remote(server, "/slow-once", rm_timeout=0.2) == 0.25
    assert server.hits["/slow-once"] == 2


def test_500s_then_success(server):
    assert score_remote(server, "/fail-twice") == 0.5
    assert server.hits["/fail-twice"] == 3


def test_always_failing_names_the_url_and_the_last_failure(server):
    with pytest.raises(RemoteRewardError) as err:
        score_remote(server, "/always-500", rm_max_retries=2)
    message = str(err.value)
    assert url(server, "/always-500") in message
    assert "after 3 attempts" in message and "HTTP 500" in message and "boom" in message
    assert server.hits["/always-500"] == 3


@pytest.mark.parametrize(("path", "needle"), [
    ("/not-json", "non-JSON body"),
    ("/list", "expected a number or an object"),
    ("/bad-request", "HTTP 400"),
    ("/nan", "returned 'NaN' for sample 5 \\(group 2, rollout 7\\): a reward must be a finite number"),
    ("/nan-dict", "a reward must be a finite number"),
])
def test_malformed_replies_fail_at_once(server, path, needle):
    with pytest.raises(RemoteRewardError, match=needle) as err:
        score_remote(server, path, Sample(prompt="p", response="abc", label="L", index=5, group_index=2, rollout_id=7))
    assert url(server, path) in str(err.value)
    assert server.hits[path] == 1  # not retried


def test_unreachable_server_is_retried_then_reported():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when we call: connection refused
    opts = RewardOptions(rm_type="remote_rm", rm_url=f"http://127.0.0.1:{port}/rm", rm_max_retries=1)
    expected = rf"127.0.0.1:{port}/rm failed after 2 attempts; last failure: Client"
    with pytest.raises(RemoteRewardError, match=expected):
        asyncio.run(async_rm(Sample(response="x"), opts))


def test_batched_remote_scores_concurrently(server):
    samples = [Sample(response="x" * i) for i in range(20)]
    opts = RewardOptions(rm_type="remote_rm", rm_url=url(server, "/len"))
    assert asyncio.run(batched_async_rm(samples, opts)) == [float(i) for i in range(20)]


def test_backoff_schedule(monkeypatch):
    monkeypatch.setattr(remote_rm, "BACKOFF_BASE_S", 0.2)  # the documented default
    assert [backoff_seconds(k) for k in (1, 2, 3, 10)] == [0.2, 0.4, 0.8, 5.0]

"""Slow ``.npy`` bodies never take the search API down (issue 44 item 4): 33 clients sending ``POST
/api/search`` bodies slowly held every request slot, so every other request answered 503 for up to 120 s,
and each client that hung up left a ``ClientDisconnect`` traceback in the server log.

Real clients over real sockets on 127.0.0.1 (a second client address, 127.0.0.2, is loopback too); a
bounded number of requests; the server's body deadline is a small setting (8 s), and a test fails only
when the server never answers (a 30 s socket timeout), never on how fast it was.
"""

from __future__ import annotations

import io
import json
import logging
import socket
import threading

import numpy as np
import pytest

pytest.importorskip("faiss")
pytest.importorskip("starlette", reason="starlette not installed (pip install 'xmodal[serve]')")
pytest.importorskip("uvicorn", reason="uvicorn not installed (pip install 'xmodal[serve]')")
pytest.importorskip("httpx", reason="httpx (Starlette's TestClient) not installed (pip install 'xmodal[serve-test]')")

from test_serve_limits import TEXT_DIM, LiveServer, http_get, index_dir, run_dir, split, text_encoder  # noqa: E402,F401
from xmodal.serve import create_app  # noqa: E402
from xmodal.serve.app import MAX_FEATURE_BODIES_PER_CLIENT, MAX_REQUESTS  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
SLOW = MAX_REQUESTS + 1  # 33: one more than the request slots


def npy_body(rows: int = 2) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.random.default_rng(0).standard_normal((rows, TEXT_DIM)).astype(np.float32))
    return buf.getvalue()


def slow_client(port: int, source: str = "127.0.0.1") -> socket.socket:
    """Sends the head and 10 bytes of a 1,000-byte ``.npy`` body, then nothing."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
    sock.sendall(b"POST /api/search?k=3 HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"\x93NUMPY\x01\x00v\x00")
    return sock


def status_of(sock: socket.socket) -> int:
    """The status of the response the server sends on ``sock`` (0: closed without one)."""
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(64)
        if not chunk:
            return 0
        head += chunk
    return int(head.split(b" ", 2)[1])


def post(url: str, body: bytes, source: str = "127.0.0.1") -> tuple[int, dict]:
    import http.client

    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30, source_address=(source, 0))
    try:
        conn.request("POST", "/api/search?k=3", body=body, headers={"Content-Length": str(len(body))})
        res = conn.getresponse()
        return res.status, json.loads(res.read())
    finally:
        conn.close()


class Lines(logging.Handler):
    """The server log's records (uvicorn's error logger), with an event once ``want`` hang-up lines came."""

    def __init__(self, want: int):
        super().__init__(logging.DEBUG)
        self.records, self.want, self.done = [], want, threading.Event()

    def emit(self, record):
        self.records.append(record)
        if len(self.records) >= self.want:
            self.done.set()


def test_slow_npy_bodies_do_not_deny_service_to_others(index_dir):
    app = create_app(index_dir, warm_up=False, upload_timeout=8.0)
    with LiveServer(app) as live:
        slow = [slow_client(live.port) for _ in range(SLOW)]
        try:
            for _ in range(3):  # honest requests while 33 slow bodies are open: was 503
                status, body = http_get(live.url + "/api/search?q=a%20dog&k=3")
                assert status == 200 and len(json.loads(body)["results"]) == 3
                status, got = post(live.url, npy_body(), source="127.0.0.2")  # another client: its own budget
                assert status == 200 and len(got["answers"]) == 2, got
            # the slow client's own address has its budget: 4 bodies received, the others a quick 503
            assert post(live.url, npy_body())[0] == 503
            statuses = [status_of(s) for s in slow]  # the received ones: 408 at the 8 s deadline
            assert sorted(statuses) == [408] * MAX_FEATURE_BODIES_PER_CLIENT + [503] * (SLOW - MAX_FEATURE_BODIES_PER_CLIENT)
            assert app.state.receiving == {}
            status, got = post(live.url, npy_body())  # the budget is back once they are answered
            assert status == 200 and len(got["answers"]) == 2
        finally:
            for s in slow:
                s.close()


def test_a_client_that_hangs_up_is_one_line_in_the_log(index_dir):
    hosts = [f"127.0.0.{i}" for i in range(2, 7)]  # 5 client addresses, each within its own budget
    lines = Lines(len(hosts))
    log = logging.getLogger("uvicorn.error")
    app = create_app(index_dir, warm_up=False, upload_timeout=30.0)
    with LiveServer(app) as live:
        log.addHandler(lines)
        try:
            slow = [slow_client(live.port, h) for h in hosts]
            assert http_get(live.url + "/api/search?q=dog")[0] == 200  # their heads were read before this one
            for s in slow:
                s.close()  # hang up mid-body
            assert lines.done.wait(30), [r.getMessage() for r in lines.records]
            assert http_get(live.url + "/api/search?q=dog")[0] == 200
        finally:
            log.removeHandler(lines)
    messages = [r.getMessage() for r in lines.records]
    assert len(messages) == len(hosts), messages
    for r, m in zip(lines.records, messages):
        assert r.exc_info is None and "\n" not in m and "hung up while sending its .npy" in m, m
        assert "10 of 1000 bytes received" in m
    assert sorted(m.split()[2].rsplit(":", 1)[0] for m in messages) == hosts

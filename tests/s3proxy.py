"""A fault-injecting proxy in front of the loopback S3 server: throttling, outages, and writes
that commit upstream but whose response never reaches the client."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class FaultyS3(http.server.BaseHTTPRequestHandler):
    """Proxies to ``upstream``. ``failures_left``: the next N requests get 503 SlowDown without
    reaching S3. ``drop_conditional_puts``: the next N conditional PUTs (``If-Match`` /
    ``If-None-Match``) are forwarded, and then the connection is closed with no response.
    ``held``: while set, every request waits (a store that hangs). ``failing_paths``: requests
    whose path contains it get 503 while it is set (one kind of object unreachable)."""

    protocol_version = "HTTP/1.1"  # answers boto3's "Expect: 100-continue" at once (1.0: ~1 s)
    upstream = ""
    url = ""
    failures_left = 0
    drop_conditional_puts = 0
    failing_paths = ""
    lock = threading.Lock()
    held = threading.Event()

    def _take(self, name: str) -> bool:
        with self.lock:
            left = getattr(type(self), name)
            setattr(type(self), name, max(left - 1, 0))
            return bool(left > 0)

    def _handle(self) -> None:
        import httpx

        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        while self.held.is_set():
            time.sleep(0.02)
        failing = bool(self.failing_paths) and self.failing_paths in self.path
        if failing or self._take("failures_left"):
            payload = b"<Error><Code>SlowDown</Code><Message>slow down</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        response = httpx.request(
            self.command, self.upstream + self.path, headers=headers, content=body
        )
        conditional = "If-Match" in self.headers or "If-None-Match" in self.headers
        if self.command == "PUT" and conditional and self._take("drop_conditional_puts"):
            self.close_connection = True  # committed upstream; the client never hears of it
            return
        self.send_response(response.status_code)
        for name, value in response.headers.items():
            if name.lower() not in ("transfer-encoding", "content-length", "connection"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.content)))
        self.end_headers()
        self.wfile.write(response.content)

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _handle

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def faulty_s3(upstream: str) -> Iterator[type[FaultyS3]]:
    """A running proxy to ``upstream``; its class attributes are the faults to inject."""
    handler = type(
        "Faulty",
        (FaultyS3,),
        {
            "upstream": upstream,
            "lock": threading.Lock(),
            "held": threading.Event(),
        },
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield handler
    finally:
        handler.held.clear()
        server.shutdown()
        server.server_close()

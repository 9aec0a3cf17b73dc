"""An S3 endpoint with request latency: moto on loopback behind a delaying, counting proxy.

The proxy holds every request for a fixed delay before forwarding it to moto, and counts what it
forwarded.

Each runs in its own process (moto is CPU-bound Python; sharing one interpreter's lock with the
proxy or with the client under test would measure the lock, not the requests):

    python benchmarks/_latency_proxy.py moto                       # prints its URL
    python benchmarks/_latency_proxy.py proxy --upstream URL [--latency-ms 25]

Both print their URL on the first line of stdout and run until their stdin closes.
``MotoProcess`` and ``ProxyProcess`` start them from Python; the proxy is driven by requests to
``/__proxy__/`` paths (never forwarded, never counted): ``GET stats`` (the counters), ``POST
reset`` (the counters, then zeroed: each step measured on its own; ``reset?run=keep`` lets the
serial run going on carry on), ``POST latency?ms=N``.

The counters: requests by kind (``put`` object, ``get`` object, ``head``, ``list`` (a bucket's
listing, v2 or v1), ``delete`` (one object), ``delete_objects`` (``POST ?delete``), ``other``),
responses by status, bytes each way, the most requests in flight at once, and the longest
serial run: requests that each started while no other was in flight, one after another (a
request that starts while another is in flight ends the run; the next one to start alone
begins a new run at 1).

The proxy is a threaded HTTP/1.1 server with keep-alive (a thread per client connection, as many
as the client opens; a listen backlog of 1,024) forwarding on a keep-alive connection to the
upstream per thread: a few hundred microseconds of CPU a request, under moto's few milliseconds.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

CONTROL = "/__proxy__/"
KINDS = ("put", "get", "head", "list", "delete", "delete_objects", "other")
# not forwarded either way: the connection's own, or rewritten here
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",  # answered here (100 Continue) before the body is read
    "host",
    "content-length",
}
_LIST_V1 = {"prefix", "delimiter", "marker", "max-keys", "encoding-type"}


def request_kind(method: str, target: str) -> str:
    """What an S3 request (path-style: ``/<bucket>/<key>?<query>``) does, as counted."""
    split = urlsplit(target)
    parts = split.path.lstrip("/").split("/", 1)
    has_key = len(parts) == 2 and parts[1] != ""
    query = parse_qs(split.query, keep_blank_values=True)
    if method == "PUT":
        return "put" if has_key and not query else "other"
    if method == "GET":
        if has_key:
            return "get" if not query.keys() - {"versionId", "partNumber"} else "other"
        if "list-type" in query or (query and query.keys() <= _LIST_V1):
            return "list"
        return "other"
    if method == "HEAD":
        return "head"
    if method == "DELETE":
        return "delete" if has_key and not query else "other"
    if method == "POST" and "delete" in query:
        return "delete_objects"
    return "other"


class Counters:
    """What the proxy saw since the last reset (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self._run = 0
        self.zero()

    def zero(self) -> None:
        self.requests = dict.fromkeys(KINDS, 0)
        self.statuses: dict[str, int] = {}
        self.conditional = 0  # requests with If-Match / If-None-Match
        self.bytes_in = 0  # request bodies
        self.bytes_out = 0  # response bodies
        self.max_in_flight = self.in_flight
        self.max_serial_run = 0
        self.upstream_errors = 0
        self.first_start: float | None = None
        self.last_end: float | None = None

    def start(self, kind: str, conditional: bool) -> None:
        now = time.perf_counter()
        with self.lock:
            self._run = self._run + 1 if self.in_flight == 0 else 0
            self.max_serial_run = max(self.max_serial_run, self._run)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.requests[kind] += 1
            self.conditional += conditional
            if self.first_start is None:
                self.first_start = now

    def end(self, status: int, sent: int, received: int) -> None:
        now = time.perf_counter()
        with self.lock:
            self.in_flight -= 1
            self.statuses[str(status)] = self.statuses.get(str(status), 0) + 1
            self.bytes_in += sent
            self.bytes_out += received
            self.upstream_errors += status == 502
            self.last_end = now

    def snapshot(self, reset: bool = False, keep_run: bool = False) -> dict[str, Any]:
        """The counters; zeroed after, given ``reset`` (the serial run going on carries on
        into the next count, given ``keep_run``: a step's parts counted apart)."""
        with self.lock:
            busy = (
                self.last_end - self.first_start
                if self.first_start is not None and self.last_end is not None
                else 0.0
            )
            found = {
                "requests": dict(self.requests),
                "total": sum(self.requests.values()),
                "statuses": dict(sorted(self.statuses.items())),
                "conditional": self.conditional,
                "bytes_in": self.bytes_in,
                "bytes_out": self.bytes_out,
                "max_in_flight": self.max_in_flight,
                "max_serial_run": self.max_serial_run,
                "in_flight_now": self.in_flight,
                "first_to_last_s": round(busy, 3),
                "upstream_errors": self.upstream_errors,
            }
            if reset:
                if not keep_run:
                    self._run = 0
                self.zero()
        return found


class LatencyProxy(http.server.BaseHTTPRequestHandler):
    """Holds each request ``latency_s`` (a class attribute, changeable while it runs), then
    forwards it to ``upstream`` on this thread's keep-alive connection."""

    protocol_version = "HTTP/1.1"  # keep-alive, and boto3's "Expect: 100-continue" answered
    disable_nagle_algorithm = True
    upstream = ""
    latency_s = 0.025
    counters = Counters()
    _local = threading.local()

    def _connection(self, fresh: bool = False) -> http.client.HTTPConnection:
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is None or fresh:
            if connection is not None:
                connection.close()
            parsed = urlsplit(self.upstream)
            connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
            self._local.connection = connection
        return connection

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is not None:
            return self.rfile.read(int(length)) if int(length) else b""
        if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            return b""
        chunks = []
        while size := int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
            pass
        return b"".join(chunks)

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes, str | None]:
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Host"] = urlsplit(self.upstream).netloc
        if body or self.command in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        for attempt in range(2):
            connection = self._connection(fresh=attempt > 0)
            try:
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
            except (http.client.HTTPException, OSError):
                # a keep-alive connection the upstream closed while idle: once more, fresh
                connection.close()
                if attempt:
                    raise
                continue
            if response.will_close:
                connection.close()
            return (
                response.status,
                response.getheaders(),
                data,
                response.getheader("Content-Length"),
            )
        raise AssertionError("unreachable")

    def _control(self) -> None:
        split = urlsplit(self.path)
        action = split.path[len(CONTROL) :]
        if action == "latency":
            ms = float(parse_qs(split.query)["ms"][0])
            type(self).latency_s = ms / 1000.0
            found: dict[str, Any] = {"latency_ms": ms}
        elif action in ("stats", "reset"):
            keep_run = parse_qs(split.query).get("run") == ["keep"]
            found = self.counters.snapshot(reset=action == "reset", keep_run=keep_run)
            found["latency_ms"] = self.latency_s * 1000.0
        else:
            self.send_error(404)
            return
        payload = json.dumps(found).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _handle(self) -> None:
        if self.path.startswith(CONTROL):
            self._body()
            self._control()
            return
        conditional = "If-Match" in self.headers or "If-None-Match" in self.headers
        self.counters.start(request_kind(self.command, self.path), conditional)
        status, received, body = 502, 0, b""
        try:
            body = self._body()
            if self.latency_s > 0:
                time.sleep(self.latency_s)
            try:
                status, headers, data, length = self._forward(body)
            except (http.client.HTTPException, OSError) as error:
                status, headers, length = 502, [], None
                data = f"<Error><Code>BadGateway</Code><Message>{error}</Message></Error>".encode()
            self.send_response_only(status)
            for name, value in headers:
                if name.lower() not in HOP_BY_HOP:
                    self.send_header(name, value)
            # a HEAD's length is the object's, with no body sent
            head = self.command == "HEAD" and length is not None
            self.send_header("Content-Length", length if head else str(len(data)))
            self.end_headers()
            if self.command != "HEAD" and data:
                self.wfile.write(data)
            received = len(data)
        finally:
            self.counters.end(status, len(body), received)

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _handle

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # 128+ connections opened at once: the default backlog is 5
    allow_reuse_address = True


def serve_proxy(upstream: str, latency_ms: float, port: int = 0) -> _Server:
    """A running proxy to ``upstream`` (in this process, on a daemon thread)."""
    handler = type(
        "Proxy",
        (LatencyProxy,),
        {
            "upstream": upstream.rstrip("/"),
            "latency_s": latency_ms / 1000.0,
            "counters": Counters(),
            "_local": threading.local(),
        },
    )
    server = _Server(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _quiet_werkzeug() -> None:
    import logging

    for name in ("werkzeug", "moto"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.ERROR)
        logger.propagate = False
    try:
        from werkzeug.serving import WSGIRequestHandler

        WSGIRequestHandler.log_request = lambda *args, **kwargs: None  # type: ignore[method-assign]
    except ImportError:
        pass


def _wait_for_stdin_to_close() -> None:
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except (OSError, ValueError):
        pass


class _Child:
    """A child process of this script that prints its URL first and stops when its stdin
    closes (or, failing that, when terminated)."""

    def __init__(self, *args: str) -> None:
        self.args = [sys.executable, str(Path(__file__).resolve()), *args]
        self.url = ""
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> _Child:
        self.process = subprocess.Popen(
            self.args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode().strip()
        if not line.startswith("http://"):
            self.close()
            raise RuntimeError(f"{self.args[2:]} did not start (printed {line!r})")
        self.url = line
        return self

    def close(self) -> None:
        process = self.process
        if process is None:
            return
        self.process = None
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


class MotoProcess(_Child):
    """moto's S3 server on 127.0.0.1 (an ephemeral port) in its own process."""

    def __init__(self) -> None:
        super().__init__("moto")


class ProxyProcess(_Child):
    """The latency proxy to ``upstream`` in its own process; its counters read over HTTP."""

    def __init__(self, upstream: str, latency_ms: float) -> None:
        super().__init__("proxy", "--upstream", upstream, "--latency-ms", str(latency_ms))

    def _call(self, action: str, method: str = "GET") -> dict[str, Any]:
        request = urllib.request.Request(f"{self.url}{CONTROL}{action}", method=method, data=None)
        with urllib.request.urlopen(request, timeout=30) as response:
            found: dict[str, Any] = json.loads(response.read())
        return found

    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    def reset(self, keep_run: bool = False) -> dict[str, Any]:
        """The counters since the last reset, then zeroed (``keep_run``: the serial run going
        on carries on)."""
        return self._call("reset?run=keep" if keep_run else "reset", "POST")

    def set_latency(self, ms: float) -> None:
        self._call(f"latency?ms={ms}", "POST")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("moto", help="moto's S3 server on 127.0.0.1; prints its URL")
    proxy = sub.add_parser("proxy", help="the latency proxy; prints its URL")
    proxy.add_argument("--upstream", required=True, help="the S3 endpoint to forward to")
    proxy.add_argument("--latency-ms", type=float, default=25.0, help="delay before each request")
    proxy.add_argument("--port", type=int, default=0, help="0: any free port")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.what == "moto":
        _quiet_werkzeug()
        from moto.server import ThreadedMotoServer

        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        moto.start()
        host, port = moto.get_host_and_port()
        print(f"http://{host}:{port}", flush=True)
        _wait_for_stdin_to_close()
        moto.stop()
        return
    server = serve_proxy(args.upstream, args.latency_ms, args.port)
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    _wait_for_stdin_to_close()
    server.shutdown()


if __name__ == "__main__":
    main()

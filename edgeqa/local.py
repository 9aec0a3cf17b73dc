"""Services in this process, on loopback: an ASGI app under uvicorn in a background thread.

``make demo`` runs the CDN, the edge service and the origin this way (``demo.py``); the tests and
benchmarks start theirs with it too, so there is one way to run a service in-process.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


class LocalServer:
    """``with LocalServer(app) as server: httpx.get(server.url)``."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int | None = None, **options: Any):
        import uvicorn

        self.host = host
        self.port = port or free_port()
        options.setdefault("proxy_headers", False)  # the viewer is users.py's to decide
        config = uvicorn.Config(app, host=host, port=self.port, log_level="warning", **options)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://{host}:{self.port}"

    def start(self, timeout: float = 30) -> LocalServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started and time.monotonic() < deadline:
            if not self.thread.is_alive():
                raise RuntimeError(f"the server on {self.url} did not start")
            time.sleep(0.02)
        if not self.server.started:
            raise RuntimeError(f"the server on {self.url} did not start within {timeout} s")
        return self

    def stop(self, timeout: float = 30) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

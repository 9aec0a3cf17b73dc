"""Running an ASGI app under a real uvicorn on loopback, in a thread, for a test."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from typing import Any

import httpx
import uvicorn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, app: Any, **options: Any) -> None:
        self.port = free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", **options
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        if not self.server.started:
            raise RuntimeError("uvicorn did not start within 30 s")
        return self

    def stop(self, timeout: float = 30) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_healthy(
    url: str, child: subprocess.Popen[str] | None = None, timeout: float = 180
) -> None:
    """Poll ``url``/health until 200; fail at once with its stderr if ``child`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if child is not None and child.poll() is not None:
            raise AssertionError(child.stderr.read() if child.stderr else "the server exited")
        time.sleep(0.1)
    raise AssertionError(f"{url} did not become healthy in {timeout} s")

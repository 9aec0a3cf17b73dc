"""Servers for tests: an ASGI app under a real uvicorn on loopback, and waiting for health."""

from __future__ import annotations

import subprocess
import time

import httpx

from edgeqa.local import LocalServer, free_port

__all__ = ["Server", "free_port", "wait_healthy"]


Server = LocalServer  # a test's server on a free loopback port


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

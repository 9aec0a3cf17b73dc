"""Admission accounting: the requests an engine has accepted but not yet started."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from origin.engine.request import Request


class QueueLoad:
    """Requests added but not yet given their first slot, and their prompt tokens.

    The server's admission bound reads it: a request counts from ``add_request`` on, before the
    loop thread has picked it up, until it is first scheduled or leaves; a preempted request waits
    again but does not count again. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prompt_tokens: dict[str, int] = {}  # request id -> prompt tokens
        self._total_tokens = 0

    def add(self, request: Request) -> None:
        with self._lock:
            self._prompt_tokens[request.request_id] = len(request.prompt_ids)
            self._total_tokens += len(request.prompt_ids)

    def remove(self, requests: Iterable[Request]) -> None:
        """Stop counting ``requests`` (scheduled or gone); those not counted are ignored."""
        with self._lock:
            for request in requests:
                tokens = self._prompt_tokens.pop(request.request_id, None)
                if tokens is not None:
                    self._total_tokens -= tokens

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return len(self._prompt_tokens), self._total_tokens

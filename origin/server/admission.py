"""Admission: past a bound, a request is refused at once (429 with ``Retry-After``) instead of
joining a queue that only grows.

Bounds: requests waiting for a slot beyond the free ones (``max_queued_requests``), prompt tokens
waiting for prefill (``max_queued_tokens``), and optionally generated requests in flight per user
(``max_in_flight_per_user``). An admitted request is queued in the engine at once, so that the
next request's check sees it even before the engine's loop has picked it up.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from origin.server.protocol import APIError

if TYPE_CHECKING:
    from origin.config import OriginSettings
    from origin.engine import Engine, OutputStream


class Admission:
    def __init__(self) -> None:
        self._in_flight: dict[str, int] = {}  # user hash -> requests admitted to the engine
        self._lock = threading.Lock()
        self.service_s = 2.0  # EMA of generated requests' e2e latency, for Retry-After

    def admit(
        self,
        settings: OriginSettings,
        engine: Engine,
        user: str,
        prompt_tokens: int,
        open_stream: Callable[[], OutputStream],
    ) -> OutputStream:
        """Queue the request (``open_stream``) and count it for ``user``; 429 past a bound (the
        reason is the error's ``code``)."""
        reason = self._over_bound(settings, engine, prompt_tokens)
        with self._lock:
            per_user = settings.max_in_flight_per_user
            if reason is None and per_user and self._in_flight.get(user, 0) >= per_user:
                reason = "user_limit"
            if reason is None:
                self._in_flight[user] = self._in_flight.get(user, 0) + 1
        if reason is not None:
            raise APIError(
                429,
                f"the origin is at capacity ({reason}); retry later",
                None,
                "rate_limit_exceeded",
                reason,
                headers={"retry-after": self.retry_after(engine)},
            )
        try:
            return open_stream()
        except BaseException:
            self.release(user)
            raise

    @staticmethod
    def _over_bound(settings: OriginSettings, engine: Engine, prompt_tokens: int) -> str | None:
        waiting, queued_tokens = engine.queue_load()
        # requests that a free slot takes at the next step are not queued behind anyone
        free = max(0, engine.config.max_num_seqs - engine.num_running)
        if waiting >= settings.max_queued_requests + free:
            return "queue_full"
        if queued_tokens and queued_tokens + prompt_tokens > settings.max_queued_tokens:
            return "queued_tokens_full"
        return None

    def release(self, user: str) -> None:
        """The user's admitted request is over."""
        with self._lock:
            left = self._in_flight.get(user, 0) - 1
            if left > 0:
                self._in_flight[user] = left
            else:
                self._in_flight.pop(user, None)

    def observe_service(self, e2e_s: float) -> None:
        self.service_s = 0.9 * self.service_s + 0.1 * e2e_s

    def retry_after(self, engine: Engine | None) -> str:
        """Seconds until a slot is likely free: the queue ahead over the slots, in service times."""
        waiting = engine.queue_load()[0] if engine else 0
        slots = engine.config.max_num_seqs if engine else 1
        return str(max(1, min(60, math.ceil(self.service_s * (1 + waiting / slots)))))

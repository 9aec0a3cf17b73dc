"""Admission: past a bound, a request is refused at once (429 with ``Retry-After``) instead of
joining a queue that only grows.

Bounds: requests waiting for a slot beyond the free ones (``max_queued_requests``), prompt tokens
waiting for prefill (``max_queued_tokens``), and one asker's share (a signed user, else a host —
an IPv4 address or an IPv6 /64 — with its API key, if any: ``edge_index/users.py``): generated
requests in flight (``max_in_flight_per_user``) and tokens a minute
(``max_tokens_per_minute_per_user``: a request is charged its prompt and its ``max_tokens`` when
admitted, so ``ignore_eos`` with a large ``max_tokens`` pays for the slot it holds). An admitted
request is queued in the engine at once, so that the next request's check sees it even before the
engine's loop has picked it up.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from origin.server.protocol import APIError

if TYPE_CHECKING:
    from origin.config import OriginSettings
    from origin.engine import Engine, OutputStream


_WINDOW_S = 60.0


class Admission:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._in_flight: dict[str, int] = {}  # user hash -> requests admitted to the engine
        self._spent: dict[str, deque[tuple[float, int]]] = {}  # user -> (when, tokens) in window
        self._lock = threading.Lock()
        self.clock = clock
        self.service_s = 2.0  # EMA of generated requests' e2e latency, for Retry-After

    def admit(
        self,
        settings: OriginSettings,
        engine: Engine,
        user: str,
        prompt_tokens: int,
        open_stream: Callable[[], OutputStream],
        max_tokens: int = 0,
    ) -> OutputStream:
        """Queue the request (``open_stream``) and count it for ``user``, charging it
        ``prompt_tokens + max_tokens``; 429 past a bound (the reason is the error's ``code``)."""
        charge_tokens = prompt_tokens + max_tokens
        reason = self._over_bound(settings, engine, prompt_tokens)
        retry_s: float | None = None
        with self._lock:
            per_user = settings.max_in_flight_per_user
            if reason is None and per_user and self._in_flight.get(user, 0) >= per_user:
                reason = "user_limit"
            if reason is None:
                retry_s = self._charge(user, charge_tokens, settings.max_tokens_per_minute_per_user)
                reason = "user_tokens" if retry_s is not None else None
            if reason is None:
                self._in_flight[user] = self._in_flight.get(user, 0) + 1
        if reason is not None:
            raise self._refusal(reason, retry_s, engine)
        try:
            return open_stream()
        except BaseException:
            self.release(user)
            raise

    def check_share(self, settings: OriginSettings, engine: Engine, user: str) -> None:
        """429 at once when ``user`` already has its share of requests in flight: checked before
        the prompt is tokenized or looked up, so a flood of refused requests costs the server as
        little as it can (``admit`` checks again, under its lock)."""
        per_user = settings.max_in_flight_per_user
        if per_user and self._in_flight.get(user, 0) >= per_user:
            raise self._refusal("user_limit", None, engine)

    def _refusal(self, reason: str, retry_s: float | None, engine: Engine) -> APIError:
        after = str(math.ceil(retry_s)) if retry_s is not None else self.retry_after(engine)
        return APIError(
            429,
            f"the origin is at capacity ({reason}); retry later",
            None,
            "rate_limit_exceeded",
            reason,
            headers={"retry-after": after},
        )

    def _charge(self, user: str, tokens: int, per_minute: int) -> float | None:
        """Charge ``tokens`` to ``user``'s last minute; None when within ``per_minute`` (0: no
        bound), else the seconds until enough of the window has passed. Holds the lock."""
        if not per_minute:
            return None
        now = self.clock()
        spent = self._spent.setdefault(user, deque())
        while spent and spent[0][0] <= now - _WINDOW_S:
            spent.popleft()
        total = sum(t for _, t in spent)
        if spent and total + tokens > per_minute:  # (alone, even a larger request is let in)
            # the oldest charges leave the window first
            freed, wait = 0, _WINDOW_S
            for when, charged in spent:
                freed += charged
                wait = when + _WINDOW_S - now
                if total - freed + tokens <= per_minute:
                    break
            return max(wait, 1.0)
        spent.append((now, tokens))
        if len(self._spent) > 100_000:  # forget askers idle for a minute
            for idle in [u for u, d in self._spent.items() if not d or d[-1][0] <= now - _WINDOW_S]:
                del self._spent[idle]
        return None

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

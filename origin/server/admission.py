"""Admission: past a bound, a request is refused at once (429 with ``Retry-After``) instead of
joining a queue that only grows.

Bounds: requests waiting for a slot beyond the free ones (``max_queued_requests``), prompt tokens
waiting for prefill (``max_queued_tokens``), one asker's share (a signed user, else a host —
an IPv4 address or an IPv6 /64 — with its API key, if any: ``base/users.py``): requests in
flight (``max_in_flight_per_user``) and tokens a minute (``max_tokens_per_minute_per_user``: a
request is charged its prompt and its ``max_tokens`` when admitted, so ``ignore_eos`` with a large
``max_tokens`` pays for the slot it holds), and one network's: requests in flight from the viewer's
/24 or /48 (``max_in_flight_per_network``; ``base/users.NETWORK_BITS``, the networks mining
counts), whoever asks from it, signed users included. A free IPv6 /48 is 65,536 /64 askers: the
per-asker share alone would let it hold 65,536 shares.

A request holds its place in its asker's and its network's shares from the share check (``hold``),
before its prompt is tokenized, until its response is over: prompts waiting for the tokenizer count
as much as answers being generated, so a burst of long prompts from one asker (one network) puts
at most its share ahead of another's prompt, and an asker over its share (requests, or the
minute's tokens) is refused before any tokenizing. A refused request costs its asker
``REFUSAL_TOKENS`` of the minute's tokens, so hammering with requests that will be refused is not
free. An admitted request is queued in the engine at once, so that the next request's check sees
it even before the engine's loop has picked it up.
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
# a refused request's cost to its asker, in tokens of the minute's share: refusals are cheap, but
# an asker hammering with them spends its share (the default share, 20,000, is 200 refusals)
REFUSAL_TOKENS = 100
# charges this close together are one entry of an asker's window (they leave it together), so a
# window holds at most a minute's worth of entries however fast an asker is refused
_BUCKET_S = 1.0


class Admission:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        # user hash -> requests past the share check: being tokenized, looked up or generated
        self._in_flight: dict[str, int] = {}
        self._network_in_flight: dict[str, int] = {}  # network hash -> the same, per network
        self._spent: dict[str, deque[tuple[float, int]]] = {}  # user -> (when, tokens) in window
        self._lock = threading.Lock()
        self.clock = clock
        self.service_s = 2.0  # EMA of generated requests' e2e latency, for Retry-After

    def hold(self, settings: OriginSettings, engine: Engine, user: str, network: str = "") -> None:
        """Count a request in ``user``'s and ``network``'s shares until ``release``: called
        before its prompt is tokenized or looked up, so one asker (one network) never has more
        than its share of prompts waiting for the tokenizer. 429 ``user_limit`` when the asker
        already has its share of requests in flight, ``network_limit`` when its network has
        (``network`` "": the viewer is unknown, no network share), ``user_tokens`` when its
        minute's tokens are spent."""
        reason: str | None = None
        retry_s: float | None = None
        with self._lock:
            per_user = settings.max_in_flight_per_user
            per_network = settings.max_in_flight_per_network if network else 0
            if per_user and self._in_flight.get(user, 0) >= per_user:
                reason = "user_limit"
            elif per_network and self._network_in_flight.get(network, 0) >= per_network:
                reason = "network_limit"
            else:
                retry_s = self._spent_wait(user, settings.max_tokens_per_minute_per_user)
                if retry_s is not None:
                    reason = "user_tokens"
                else:
                    _add(self._in_flight, user, 1)
                    if network:
                        _add(self._network_in_flight, network, 1)
        if reason is not None:
            raise self._refusal(reason, retry_s, engine)

    def admit(
        self,
        settings: OriginSettings,
        engine: Engine,
        user: str,
        prompt_tokens: int,
        open_stream: Callable[[], OutputStream],
        max_tokens: int = 0,
    ) -> OutputStream:
        """Queue the request (``open_stream``), which ``hold`` counted for ``user``, charging it
        ``prompt_tokens + max_tokens``; 429 past a bound (the reason is the error's ``code``).
        The hold stays the caller's until this returns."""
        reason = self._over_bound(settings, engine, prompt_tokens)
        retry_s: float | None = None
        if reason is None:
            per_minute = settings.max_tokens_per_minute_per_user
            with self._lock:
                retry_s = self._charge(user, prompt_tokens + max_tokens, per_minute)
            reason = "user_tokens" if retry_s is not None else None
        if reason is not None:
            raise self._refusal(reason, retry_s, engine)
        return open_stream()

    def charge_refusal(self, settings: OriginSettings, user: str) -> None:
        """``user``'s request was refused: it costs ``REFUSAL_TOKENS`` of the minute's share."""
        if settings.max_tokens_per_minute_per_user:
            with self._lock:
                self._record(user, REFUSAL_TOKENS, self.clock())

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

    def _window(self, user: str, now: float) -> deque[tuple[float, int]] | None:
        """``user``'s charges of the last minute (None: none ever). Holds the lock."""
        spent = self._spent.get(user)
        while spent and spent[0][0] <= now - _WINDOW_S:
            spent.popleft()
        return spent

    def _spent_wait(self, user: str, per_minute: int) -> float | None:
        """None while ``user`` has tokens left this minute (``per_minute`` 0: no bound), else the
        seconds until enough have left the window for the asker's next request to pass, this
        refusal's cost included. Holds the lock."""
        if not per_minute:
            return None
        now = self.clock()
        spent = self._window(user, now)
        total = sum(t for _, t in spent) if spent else 0
        if not spent or total < per_minute:
            return None
        return _wait_s(spent, now, total + REFUSAL_TOKENS - per_minute + 1)

    def _charge(self, user: str, tokens: int, per_minute: int) -> float | None:
        """Charge ``tokens`` to ``user``'s last minute; None when within ``per_minute`` (0: no
        bound), else the seconds until enough of the window has passed for this request, its
        refusal charged too. Holds the lock."""
        if not per_minute:
            return None
        now = self.clock()
        spent = self._window(user, now)
        total = sum(t for _, t in spent) if spent else 0
        if spent and total + tokens > per_minute:  # (alone, even a larger request is let in)
            return _wait_s(spent, now, total + REFUSAL_TOKENS + tokens - per_minute)
        self._record(user, tokens, now)
        return None

    def _record(self, user: str, tokens: int, now: float) -> None:
        """Add ``tokens`` to ``user``'s window. Holds the lock."""
        spent = self._window(user, now)
        if spent is None:
            spent = self._spent[user] = deque()
        if spent and now - spent[-1][0] < _BUCKET_S:
            when, charged = spent[-1]
            spent[-1] = (when, charged + tokens)
        else:
            spent.append((now, tokens))
        if len(self._spent) > 100_000:  # forget askers idle for a minute
            for idle in [u for u, d in self._spent.items() if not d or d[-1][0] <= now - _WINDOW_S]:
                del self._spent[idle]

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

    def release(self, user: str, network: str = "") -> None:
        """The request ``hold`` counted for ``user`` and ``network`` is over (refused, answered
        or generated)."""
        with self._lock:
            _add(self._in_flight, user, -1)
            if network:
                _add(self._network_in_flight, network, -1)

    def observe_service(self, e2e_s: float) -> None:
        self.service_s = 0.9 * self.service_s + 0.1 * e2e_s

    def retry_after(self, engine: Engine | None) -> str:
        """Seconds until a slot is likely free: the queue ahead over the slots, in service times."""
        waiting = engine.queue_load()[0] if engine else 0
        slots = engine.config.max_num_seqs if engine else 1
        return str(max(1, min(60, math.ceil(self.service_s * (1 + waiting / slots)))))


def _add(counts: dict[str, int], key: str, delta: int) -> None:
    """Add ``delta`` to ``counts[key]``, forgetting a count that drops to 0."""
    left = counts.get(key, 0) + delta
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


def _wait_s(spent: deque[tuple[float, int]], now: float, excess: int) -> float:
    """Seconds until at least ``excess`` tokens of the window ``spent`` have left it (at least 1;
    the oldest charges leave first)."""
    freed, wait = 0, _WINDOW_S
    for when, charged in spent:
        freed += charged
        wait = when + _WINDOW_S - now
        if freed >= excess:
            break
    return max(wait, 1.0)

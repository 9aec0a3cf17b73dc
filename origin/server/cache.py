"""The origin's online cache: answers generated in the last hours, by question key.

Tomorrow's release covers today's hot questions; until then this cache answers a repeat of a
question the origin has just generated. Entries expire after ``ttl_s`` with random jitter (so a
burst of answers written together does not expire together and stampede the engine), and the
cache holds at most ``max_bytes`` of text, evicting the least recently used entries first.

Only greedy, single-turn, personal-data-free answers of the served profile are written here (the
server decides); entries are keyed by the key spec's key of the normalized question, scoped by
the server to the caller's tenant (its API key and ``x-edgeqa-tenant``). An entry is served only
once ``min_users`` distinct askers have asked for it, counted as mining counts a question's
askers: the fewer of its distinct identities and its distinct networks (hashed, ``base/users.py``:
the viewer's /24 or /48; an asker without a network counts its identity as its network, as a log
row without one does). Like a published answer, a cached one never tells anyone what fewer than k
people asked lately, and five /64s of one /48 are one network, not five.

An entry remembers whether the release's tiers were searched for its question before it was
generated (``checked``): a client that had just missed at the edge lets the origin skip them
(``base/missed.py``), and what it generated then must not answer another caller ahead of them
(``origin/server/tiers.py``).
"""

from __future__ import annotations

import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class CachedAnswer:
    answer: str
    completion_tokens: int
    expires_at: float  # monotonic seconds
    askers: set[str] = field(default_factory=set)  # up to min_users hashed identities
    networks: set[str] = field(default_factory=set)  # up to min_users hashed networks
    # the release's tiers missed its question (False: a client's hint skipped them)
    checked: bool = True


# the entry's text plus what a dict slot, the key and the dataclass cost, roughly
_OVERHEAD_BYTES = 200


class OnlineCache:
    def __init__(
        self,
        ttl_s: float = 3600.0,
        jitter: float = 0.1,
        max_bytes: int = 64 << 20,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        min_users: int = 1,
    ) -> None:
        if ttl_s < 0 or not 0 <= jitter < 1 or max_bytes < 0 or min_users < 1:
            raise ValueError(
                "ttl_s >= 0, 0 <= jitter < 1, max_bytes >= 0 and min_users >= 1 are required"
            )
        self.min_users = min_users
        self.ttl_s = ttl_s
        self.jitter = jitter
        self.max_bytes = max_bytes
        self.clock = clock
        self.rng = rng or random.Random()
        self._entries: OrderedDict[str, CachedAnswer] = OrderedDict()
        self._bytes = 0
        self._revoked: Callable[[str], bool] = lambda key: False
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.held = 0  # misses of an entry not yet asked for by min_users askers
        self.evictions = 0
        self.expirations = 0

    @property
    def enabled(self) -> bool:
        return self.ttl_s > 0 and self.max_bytes > 0

    @staticmethod
    def _size(key: str, entry: CachedAnswer) -> int:
        return len(key) + len(entry.answer.encode("utf-8")) + _OVERHEAD_BYTES

    def _count(self, entry: CachedAnswer, asker: str, network: str) -> bool:
        """Count ``asker`` (from ``network``) toward ``entry``'s k; whether it has reached k:
        ``min_users`` distinct askers and as many distinct networks. Holds the lock (or owns
        ``entry``, not yet stored)."""
        for seen, who in ((entry.askers, asker), (entry.networks, network or f"user:{asker}")):
            if len(seen) < self.min_users:
                seen.add(who)
        return min(len(entry.askers), len(entry.networks)) >= self.min_users

    def get(self, key: str, asker: str = "", network: str = "") -> CachedAnswer | None:
        """The entry, once ``min_users`` distinct askers from as many distinct networks
        (``asker`` from ``network`` counted) asked for it."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            if entry.expires_at <= self.clock():
                self._remove(key)
                self.expirations += 1
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            if not self._count(entry, asker, network):
                self.misses += 1
                self.held += 1
                return None
            self.hits += 1
            return entry

    def put(
        self,
        key: str,
        answer: str,
        completion_tokens: int,
        asker: str = "",
        checked: bool = True,
        network: str = "",
    ) -> bool:
        """Store an answer generated for ``asker`` (from ``network``); False when caching is off
        or the entry alone exceeds the bound. ``checked``: the release's semantic tier was
        searched first. The askers (and networks) of an entry it replaces still count, and so
        does its check."""
        if not self.enabled or self._revoked(key):
            return False
        ttl = self.ttl_s * (1 + self.rng.uniform(-self.jitter, self.jitter))
        entry = CachedAnswer(answer, completion_tokens, self.clock() + ttl, checked=checked)
        self._count(entry, asker, network)
        size = self._size(key, entry)
        if size > self.max_bytes:
            return False
        with self._lock:
            if key in self._entries:
                old = self._entries[key]
                if old.expires_at > self.clock():
                    entry.askers |= set(list(old.askers)[: self.min_users])
                    entry.networks |= set(list(old.networks)[: self.min_users])
                    entry.checked = entry.checked or old.checked
                self._remove(key)
            self._entries[key] = entry
            self._bytes += size
            while self._bytes > self.max_bytes:
                oldest = next(iter(self._entries))
                self._remove(oldest)
                self.evictions += 1
        return True

    def check(self, key: str) -> None:
        """The release's semantic tier has now been searched for ``key``'s question and missed:
        its entry answers ahead of that tier from now on."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                entry.checked = True

    def revoke(self, revoked: Callable[[str], bool]) -> int:
        """Drop every entry ``revoked`` picks and cache none it picks from now on (until the next
        call: the served release lists the revocations in force); how many were dropped."""
        with self._lock:
            self._revoked = revoked
            doomed = [key for key in self._entries if revoked(key)]
            for key in doomed:
                self._remove(key)
        return len(doomed)

    def _remove(self, key: str) -> None:
        entry = self._entries.pop(key)
        self._bytes -= self._size(key, entry)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

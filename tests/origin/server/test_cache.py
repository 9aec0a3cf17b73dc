"""The origin's online cache: TTL with jitter, a memory bound with LRU eviction."""

from __future__ import annotations

import random

import pytest

from origin.server.cache import OnlineCache


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_entries_expire_with_jitter_spread() -> None:
    clock = Clock()
    cache = OnlineCache(ttl_s=100, jitter=0.2, clock=clock, rng=random.Random(1))
    for i in range(200):
        assert cache.put(f"k{i}", "answer", 1)
    expiries = sorted(cache._entries[f"k{i}"].expires_at for i in range(200))
    assert 80 <= expiries[0] < 90 and 110 < expiries[-1] <= 120  # spread over +-20 %
    clock.now = 100
    alive = sum(cache.get(f"k{i}") is not None for i in range(200))
    assert 40 < alive < 160  # about half expired at the nominal TTL, not all at once
    clock.now = 121
    assert all(cache.get(f"k{i}") is None for i in range(200))
    assert len(cache) == 0 and cache.bytes == 0 and cache.expirations == 200


def test_memory_bound_evicts_least_recently_used() -> None:
    cache = OnlineCache(ttl_s=100, jitter=0, max_bytes=1000)
    for i in range(3):
        cache.put(f"k{i}", "x" * 100, 10)
    assert cache.get("k0") is not None  # k0 is now the most recently used
    cache.put("k3", "x" * 100, 10)  # each entry costs ~300 bytes: one must go
    assert cache.bytes <= 1000 and cache.evictions > 0
    assert cache.get("k0") is not None and cache.get("k1") is None
    assert not cache.put("huge", "x" * 5000, 1)  # larger than the whole bound: refused
    cache.put("k0", "new", 1)  # replacing keeps the byte count exact
    assert cache.get("k0").answer == "new"  # type: ignore[union-attr]
    cache.clear()
    assert cache.bytes == 0 and len(cache) == 0


def test_off_and_invalid_settings() -> None:
    assert not OnlineCache(ttl_s=0).put("k", "a", 1)
    assert not OnlineCache(max_bytes=0).put("k", "a", 1)
    with pytest.raises(ValueError):
        OnlineCache(jitter=1.5)


def test_an_answer_is_served_only_once_k_distinct_askers_asked_for_it() -> None:
    cache = OnlineCache(min_users=3)
    cache.put("k", "an answer", 2, asker="ann")
    assert cache.get("k", "ann") is None and cache.get("k", "ann") is None  # one asker, twice
    assert cache.get("k", "bob") is None
    hit = cache.get("k", "cy")  # the third distinct asker
    assert hit is not None and hit.answer == "an answer"
    assert cache.get("k", "ann") is not None  # from then on, everyone
    assert cache.held == 3 and cache.hits == 2
    # a regenerated answer keeps the askers counted so far
    cache.put("j", "first", 1, asker="ann")
    assert cache.get("j", "bob") is None
    cache.put("j", "second", 1, asker="bob")
    assert cache.get("j", "cy") is not None
    with pytest.raises(ValueError, match="min_users"):
        OnlineCache(min_users=0)


def test_an_entry_remembers_whether_the_release_was_searched_before_it() -> None:
    cache = OnlineCache()
    cache.put("k", "generated after a client's hint", 5, asker="ann", checked=False)
    entry = cache.get("k", "bob")
    assert entry is not None and not entry.checked
    cache.check("k")  # the semantic tier has missed for it since
    assert cache.get("k", "cy").checked  # type: ignore[union-attr]
    # regenerated after another hint, it stays checked
    cache.put("k", "again", 1, asker="dee", checked=False)
    assert cache.get("k", "dee").checked  # type: ignore[union-attr]
    cache.check("absent")  # nothing to mark
    assert cache.get("absent") is None


def test_k_counts_networks_as_mining_does() -> None:
    """k is the fewer of distinct askers and distinct networks: five /64s of one /48 (five
    askers, one network) are not five; an asker without a network counts as its own."""
    cache = OnlineCache(min_users=3)
    cache.put("k", "an answer", 2, asker="h1", network="net-a")
    assert cache.get("k", "h2", "net-a") is None and cache.get("k", "h3", "net-a") is None
    assert cache.get("k", "h4", "net-a") is None  # four askers, one network
    assert cache.get("k", "h5", "net-b") is None  # two networks
    assert cache.get("k", "h6", "net-c") is not None  # three
    # a regenerated answer keeps the networks counted so far
    cache.put("j", "first", 1, asker="h1", network="net-a")
    assert cache.get("j", "h2", "net-b") is None
    cache.put("j", "second", 1, asker="h3", network="net-a")
    assert cache.get("j", "h4", "net-c") is not None
    # no network known: each asker is its own (as mining counts a log row without one)
    cache.put("n", "answer", 1, asker="u1")
    assert cache.get("n", "u2") is None and cache.get("n", "u3") is not None

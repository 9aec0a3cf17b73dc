"""Mining rules: k distinct users, PII, multi-turn, clustering, ranking; every exclusion counted."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from edge_index.keys import key
from precompute.config import MiningConfig
from precompute.mining import Phrasing, mine

NOW = datetime(2026, 11, 29, tzinfo=UTC)


def _asks(query: str, users: list[str], days_ago: float = 1.0, **extra: Any) -> list[dict]:
    ts = NOW - timedelta(days=days_ago)
    return [
        {
            "ts": ts,
            "user": u,
            "query": query,
            "turns": 1,
            "tier": "generated",
            "status": 200,
            **extra,
        }
        for u in users
    ]


def _users(n: int, tag: str = "u") -> list[str]:
    return [f"{tag}{i}" for i in range(n)]


def test_k_distinct_users_each_counted_once(embedder) -> None:  # type: ignore[no-untyped-def]
    rows = _asks("How do I freeze my card?", _users(5))
    rows += _asks("What are your opening hours?", ["same"] * 40)  # one user, many asks
    rows += _asks("What are your opening hours?", _users(3, "v"))  # 4 distinct in all
    hot, report = mine(rows, embedder, MiningConfig(k=5), NOW)
    assert [h.question for h in hot] == ["How do I freeze my card?"]
    assert report.excluded_phrasings == {"below_k": 1}
    assert report.excluded_rows == {"below_k": 43}


def test_exclusions_are_counted_by_reason(embedder) -> None:  # type: ignore[no-untyped-def]
    rows = _asks("How do I close my account?", _users(6))
    rows += _asks("and what about savings?", _users(9), turns=2)
    rows += _asks("My email is jo@example.com, help", _users(7))
    rows += _asks("Is card 4111 1111 1111 1111 blocked?", _users(7))
    rows += _asks("How do I close my account?", _users(3, "w"), status=500, tier="error")
    rows += _asks("   ???  ", _users(6))
    rows += _asks("How do I close my account?", _users(4, "m"), tier="miss", status=404)
    hot, report = mine(rows, embedder, MiningConfig(k=5), NOW)
    assert [h.question for h in hot] == ["How do I close my account?"]
    assert hot[0].users == 6  # the failed requests' users do not count
    assert report.excluded_rows == {
        "multi_turn": 9,
        "pii": 14,
        "failed_request": 3,
        "invalid_query": 6,
        "edge_miss": 4,  # the origin logs the same asks
    }
    assert report.pii_by_kind == {"email": 7, "card": 7}


def test_a_time_sensitive_hot_question_is_never_published(embedder) -> None:  # type: ignore[no-untyped-def]
    rows = _asks("What's the weather in London today?", _users(40, "a"))  # the hottest
    rows += _asks("What is the Tesla stock price?", _users(20, "b"))
    rows += _asks("明天会下雨吗？", _users(10, "c"))
    rows += _asks("How do I freeze my card?", _users(6, "d"))
    hot, report = mine(rows, embedder, MiningConfig(k=5), NOW)
    assert [h.question for h in hot] == ["How do I freeze my card?"]
    assert report.excluded_rows == {"time_sensitive": 70}
    assert report.time_sensitive_by_kind == {"weather": 50, "price": 20}
    # a question about the weather whose answer does not change publishes
    hot, _ = mine(_asks("How does the weather affect deliveries?", _users(40)), embedder, None, NOW)
    assert [h.question for h in hot] == ["How does the weather affect deliveries?"]


def test_near_duplicates_cluster_under_the_most_common_phrasing(embedder) -> None:  # type: ignore[no-untyped-def]
    rows = _asks("How do I reset my password?", _users(9, "a"))
    rows += _asks("how do i reset my password", _users(3, "b"))  # same key as the first
    rows += _asks("How can I reset my password?", _users(6, "c"))
    rows += _asks("What is the daily limit for 100 pound notes?", _users(5, "d"))
    rows += _asks("What is the daily limit for 200 pound notes?", _users(5, "e"))
    hot, report = mine(rows, embedder, MiningConfig(k=5), NOW)
    by_key = {h.key: h for h in hot}
    reset = by_key[key("How do I reset my password?")]
    assert reset.question == "How do I reset my password?"  # 9 of its 12 asks used this form
    assert [p.key for p in reset.phrasings] == [
        key("How do I reset my password?"),
        key("How can I reset my password?"),
    ]
    assert reset.users == 18
    # numbers differ: never merged, however similar the sentences
    assert key("What is the daily limit for 100 pound notes?") in by_key
    assert key("What is the daily limit for 200 pound notes?") in by_key
    assert report.merged_phrasings == 1 and report.clusters == 3


def test_ranking_is_distinct_users_times_recency(embedder) -> None:  # type: ignore[no-untyped-def]
    rows = _asks("How do I order a new card?", _users(10, "a"), days_ago=30)  # many, old
    rows += _asks("What is my sort code?", _users(6, "b"), days_ago=0.5)  # fewer, recent
    rows += _asks("How do I activate my card?", _users(5, "c"), days_ago=60)
    config = MiningConfig(k=5, top_n=2, half_life_days=7)
    hot, report = mine(rows, embedder, config, NOW)
    assert [h.question for h in hot] == ["What is my sort code?", "How do I order a new card?"]
    assert hot[0].score == pytest.approx(6 * 0.5 ** (0.5 / 7))
    assert report.excluded_phrasings == {"below_top_n": 1}
    assert report.excluded_rows == {"below_top_n": 5}
    assert report.published_clusters == 2


def _carried(rows: list[dict], embedder: Any, k: int = 5) -> list[Phrasing]:
    """What last night's run mined from ``rows``, as its hot.json gives it back."""
    hot, _ = mine(rows, embedder, MiningConfig(k=k), NOW - timedelta(days=1))
    return [Phrasing.from_dict(p.as_dict()) for h in hot for p in h.phrasings]


def test_carried_evidence_keeps_a_question_above_k_until_it_fades(embedder) -> None:  # type: ignore[no-untyped-def]
    carried = _carried(_asks("How do I freeze my card?", _users(5), days_ago=2), embedder)
    # tonight's logs: the question was answered from the CDN, never logged
    tonight = _asks("What are your opening hours?", _users(5, "v"), days_ago=0.5)
    hot, report = mine(tonight, embedder, MiningConfig(k=5), NOW, carried)
    assert [h.question for h in hot] == ["What are your opening hours?", "How do I freeze my card?"]
    freeze = hot[1]
    assert (freeze.users, freeze.hits) == (5, 0)  # hits: this window's asks
    assert freeze.score == pytest.approx(5 * 0.5 ** (2 / 7))  # decayed like any old ask
    assert (report.carried_phrasings, report.carried_users, report.expired_users) == (1, 5, 0)
    assert report.excluded_phrasings == {}

    # merged per user, keeping each one's latest ask: 3 of them ask again, 1 new user
    again = _asks("How do I freeze my card?", ["u0", "u1", "u2", "new"], days_ago=0.25)
    hot, report = mine(again, embedder, MiningConfig(k=5), NOW, carried)
    (freeze,) = hot
    assert (freeze.users, freeze.hits, report.carried_users) == (6, 4, 2)
    assert freeze.canonical.latest_by_user["u0"] == NOW - timedelta(days=0.25)
    assert freeze.canonical.latest_by_user["u4"] == NOW - timedelta(days=2)

    # 4 half-lives after the asks the evidence still counts; a day later it is gone
    at_cutoff = NOW + timedelta(days=26)
    hot, _ = mine([], embedder, MiningConfig(k=5), at_cutoff, carried)
    assert [h.question for h in hot] == ["How do I freeze my card?"]
    hot, report = mine([], embedder, MiningConfig(k=5), at_cutoff + timedelta(days=1), carried)
    assert hot == [] and report.carried_phrasings == 0 and report.expired_users == 5
    # carrying nothing at all
    hot, _ = mine([], embedder, MiningConfig(k=5, carry_half_lives=0), NOW, carried)
    assert hot == []


def test_carried_evidence_obeys_the_rules_of_tonight(embedder) -> None:  # type: ignore[no-untyped-def]
    # five users behind one network: one asker (published last night with k=1)
    one_network = _asks("How do I close my account?", _users(5), network="n1")
    # two networks whose only ask is old: the users are young enough, one network is not
    two_networks = _asks("Can I get a paper statement?", _users(5, "p"), days_ago=1, network="n2")
    two_networks += _asks("Can I get a paper statement?", ["p0"], days_ago=40, network="n3")
    carried = _carried(one_network + two_networks, embedder, k=1)
    # a rule added since: this question is time-sensitive now
    stale = Phrasing(
        key("What is the weather today?"),
        "what is the weather today?",
        "What is the weather today?",
        {"w"},
        3,
        {"w": NOW},
    )
    hot, report = mine([], embedder, MiningConfig(k=2), NOW, [*carried, stale])
    assert hot == []
    assert report.excluded_phrasings == {"below_k": 2, "time_sensitive": 1}
    assert report.excluded_rows == {}  # no row of tonight's logs was left out


def test_config_is_validated() -> None:
    for bad in ({"k": 0}, {"top_n": 0}, {"half_life_days": 0}, {"cluster_threshold": 1.5}):
        with pytest.raises(ValueError):
            MiningConfig(**bad)  # type: ignore[arg-type]

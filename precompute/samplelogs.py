"""Realistic sample request logs, for the demo and the tests.

Support questions of a retail bank (written for edgeqa), each asked in several wordings as people
do: the most common one, near-duplicates of it ("how can I...", "how to..."), and a paraphrase
further away. Most questions are asked with Zipf popularity by a pool of users over a window of
days; a few are asked by only 7 or 10 people, spread over their near-duplicate wordings so that no
wording alone is typed by k=5 of them (the question publishes; k counts people per question); and
a few people add a rare aside to a hot question ("... asap", a name), which must never be
published as text. Plus what the mining rules must exclude: questions carrying personal data,
multi-turn follow-ups, failed requests, and a long tail of questions only one user asked. Users are
stored as salted hashes, as the origin does.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

from edge_index.keys import key, normalize
from edge_index.logs import LogWriter
from edge_index.store import Store
from edge_index.users import hash_user

# each question: its most common wording, two near-duplicates of it, then a paraphrase
INTENTS: tuple[tuple[str, ...], ...] = (
    (
        "How do I reset my online banking password?",
        "How can I reset my online banking password?",
        "how to reset my online banking password",
        "I forgot my password, how do I reset it?",
    ),
    (
        "How long does a bank transfer take?",
        "How long do bank transfers take?",
        "how long will my bank transfer take",
        "When will my transfer arrive?",
    ),
    (
        "How do I freeze my card?",
        "how can I freeze my card",
        "how to freeze my card",
        "how can I freeze my debit card",
    ),
    (
        "What should I do if my card is stolen?",
        "what do I do if my card is stolen",
        "What should I do if my card was stolen?",
        "my card was stolen what do i do",
    ),
    (
        "How do I change my address?",
        "how can I change my address",
        "how to change my address",
        "how can i update my home address",
    ),
    (
        "Why was my card declined?",
        "why did my card get declined",
        "Why is my card declined?",
        "my card payment was declined why",
    ),
    (
        "How do I order a new card?",
        "how can I order a new card",
        "how to order a new card",
        "how can I get a replacement card",
    ),
    (
        "What are your opening hours?",
        "what are your opening hours please",
        "what are the opening hours",
        "when are you open",
    ),
    (
        "How do I set up a direct debit?",
        "how can i set up a direct debit",
        "how to set up a direct debit",
        "how can i create a direct debit",
    ),
    (
        "Is there a fee for international transfers?",
        "is there a fee for an international transfer",
        "Are there fees for international transfers?",
        "do international transfers cost anything",
    ),
    (
        "How do I activate my new card?",
        "how can I activate my new card",
        "how to activate my new card",
        "how can I activate my card",
    ),
    (
        "What is the daily ATM withdrawal limit?",
        "What is my daily ATM withdrawal limit?",
        "what's the daily ATM withdrawal limit",
        "how much cash can I take out per day",
    ),
    (
        "How do I close my account?",
        "how can I close my account",
        "how to close my account",
        "I want to close my account",
    ),
    (
        "Can I get a paper statement?",
        "could I get a paper statement",
        "Can I request a paper statement?",
        "how do i request a printed statement",
    ),
    (
        "How do I dispute a transaction?",
        "how can I dispute a transaction",
        "how to dispute a transaction",
        "how can I dispute a card payment",
    ),
    (
        "What is my sort code?",
        "what is my sort code please",
        "whats my sort code",
        "where can I find my sort code",
    ),
)
NEAR_DUPLICATES = 3  # the first wordings of each question, which cluster together
# what one person adds to a hot question: never published (fewer than k typed it)
ASIDES = (" asap", " quickly", "?? urgent", ", I am Anna Kowalczyk")

PII_TEMPLATES = (
    "My email is {name}@example.com, why can't I log in?",
    "Please call me back on +44 7700 900{n:03d}",
    "Is my card 4111 1111 1111 1111 blocked?",
    "My social security number is 123-45-{n:04d}, can you check my account?",
    "Why does https://bank.example.com/reset?token=abc{n}def not work?",
    "My account number is 12345{n:04d}99, what is my balance?",
)

FOLLOW_UPS = ("and what about my savings account?", "can you explain that again?", "why?")


def spread_askers(
    wordings: Sequence[str], people: Sequence[str], max_per_wording: int
) -> list[tuple[str, str]]:
    """(wording, person): one question asked once by each of ``people``, round robin over its
    ``wordings``, so that no wording is typed by more than ``max_per_wording`` of them."""
    if len(people) > len(wordings) * max_per_wording:
        raise ValueError(
            f"{len(people)} people cannot ask {len(wordings)} wordings {max_per_wording} each"
        )
    return [(wordings[i % len(wordings)], person) for i, person in enumerate(people)]


def generate_rows(
    until: date,
    days: int = 7,
    intents: int = len(INTENTS),
    users: int = 400,
    asks: int = 3000,
    zipf_s: float = 1.1,
    spread_intents: int | None = None,
    aside_rows: int = 12,
    pii_rows: int = 30,
    multi_turn_rows: int = 40,
    failed_rows: int = 10,
    tail_questions: int = 60,
    salt: bytes = b"edgeqa-sample-salt",
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Log rows (the origin's columns) for ``days`` days ending ``until``, shuffled.

    ``asks`` go to the first ``intents`` questions but the last ``spread_intents`` of them
    (default: a quarter), with Zipf popularity over questions, and within a question over its
    wordings (the first most often). Each of the ``spread_intents`` is asked by 7 or 10 people
    of the pool, spread over its near-duplicate wordings (at most 4 each: no wording reaches k=5
    on its own). ``aside_rows``: one person each adds an aside to a Zipf question's wording."""
    rng = random.Random(seed)
    chosen = INTENTS[:intents]
    spread = len(chosen) // 4 if spread_intents is None else spread_intents
    zipf, spread_questions = chosen[: len(chosen) - spread], chosen[len(chosen) - spread :]
    weights = [1.0 / (rank + 1) ** zipf_s for rank in range(len(zipf))]
    order = list(range(len(zipf)))
    rng.shuffle(order)  # popularity independent of the question's position
    pool = [f"user-{i:05d}" for i in range(users)]
    start = datetime.combine(until - timedelta(days=days - 1), datetime.min.time(), UTC)
    span = days * 86400 - 1

    def row(query: str, user: str, turns: int = 1, tier: str = "generated", status: int = 200):
        ts = start + timedelta(seconds=rng.randint(0, span))
        try:
            normalized, k = normalize(query), key(query)
        except ValueError:
            normalized, k = "", ""
        return {
            "ts": ts,
            "request_id": f"{rng.getrandbits(64):016x}",
            "user": hash_user(user, salt),
            "tenant": "demo",
            "query": query,
            "normalized": normalized,
            "key": k,
            "turns": turns,
            "tier": tier,
            "status": status,
            "latency_ms": round(rng.uniform(5, 900), 1),
            "ttft_ms": round(rng.uniform(5, 400), 1),
            "profile": "",
        }

    rows = []
    if zipf:
        for index in rng.choices(order, weights=weights, k=asks):
            wordings = zipf[index]
            (query,) = rng.choices(wordings, weights=[1 / (i + 1) for i in range(len(wordings))])
            rows.append(row(query, rng.choice(pool)))
        for n in range(aside_rows):
            query = rng.choice(zipf)[0].rstrip("?").lower() + ASIDES[n % len(ASIDES)]
            rows.append(row(query, rng.choice(pool)))
    for wordings in spread_questions:
        # 7 or 10 people: 3-2-2 or 4-3-3 over the wordings, so the first is the most typed on
        # every night (a tie would be broken by asks, which change with the window)
        people = rng.sample(pool, min(rng.choice((7, 10)), len(pool)))
        for query, person in spread_askers(wordings[:NEAR_DUPLICATES], people, 4):
            rows.append(row(query, person))
    for n in range(pii_rows):
        template = PII_TEMPLATES[n % len(PII_TEMPLATES)]
        # asked by many users, so only the PII filter can stop it
        rows.append(row(template.format(name=f"alex{n % 3}", n=n % 3), pool[n % users]))
    for n in range(multi_turn_rows):
        rows.append(row(FOLLOW_UPS[n % len(FOLLOW_UPS)], pool[n % users], turns=2 + n % 3))
    for n in range(failed_rows):
        rows.append(row("x" * 10, pool[n % users], tier="rejected", status=400))
    for n in range(tail_questions):
        rows.append(row(f"Can I open account type number {n} in branch {n % 7}?", pool[n % users]))
    rng.shuffle(rows)
    return rows


def write_logs(store: Store, rows: Sequence[dict[str, Any]], max_rows: int = 500) -> int:
    """Write rows through the same ``LogWriter`` the services use."""
    with LogWriter(store, source="sample", max_rows=max_rows, flush_interval_s=0) as writer:
        for r in rows:
            writer.write(**r)
    return writer.rows_written

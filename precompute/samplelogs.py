"""Realistic sample request logs, for the demo and the tests.

Support questions of a retail bank (written for edgeqa), each with several paraphrases, asked
with Zipf popularity by a pool of users over a window of days; plus what the mining rules must
exclude: questions carrying personal data, multi-turn follow-ups, failed requests, and a long
tail of questions only one user asked. Users are stored as salted hashes, as the origin does.
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

INTENTS: tuple[tuple[str, ...], ...] = (
    (
        "How do I reset my online banking password?",
        "how can i reset my password",
        "I forgot my password, how do I reset it?",
        "Reset online banking password",
    ),
    (
        "How long does a bank transfer take?",
        "how long do transfers take to arrive",
        "When will my transfer arrive?",
    ),
    (
        "How do I freeze my card?",
        "how can I freeze my debit card",
        "Freeze my card please",
    ),
    (
        "What should I do if my card is stolen?",
        "my card was stolen what do i do",
        "Card stolen, what now?",
    ),
    (
        "How do I change my address?",
        "how can i update my home address",
        "Change my address on my account",
    ),
    (
        "Why was my card declined?",
        "why did my card get declined",
        "my card payment was declined why",
    ),
    (
        "How do I order a new card?",
        "how can I get a replacement card",
        "Order a new debit card",
    ),
    (
        "What are your opening hours?",
        "when are you open",
        "What time does the branch open?",
    ),
    (
        "How do I set up a direct debit?",
        "how can i create a direct debit",
    ),
    (
        "Is there a fee for international transfers?",
        "do international transfers cost anything",
    ),
    (
        "How do I activate my new card?",
        "how can I activate my card",
    ),
    (
        "What is the daily ATM withdrawal limit?",
        "how much cash can I take out per day",
    ),
    (
        "How do I close my account?",
        "I want to close my account",
    ),
    (
        "Can I get a paper statement?",
        "how do i request a printed statement",
    ),
    (
        "How do I dispute a transaction?",
        "how can I dispute a card payment",
    ),
    (
        "What is my sort code?",
        "where can I find my sort code",
    ),
)

PII_TEMPLATES = (
    "My email is {name}@example.com, why can't I log in?",
    "Please call me back on +44 7700 900{n:03d}",
    "Is my card 4111 1111 1111 1111 blocked?",
    "My social security number is 123-45-{n:04d}, can you check my account?",
    "Why does https://bank.example.com/reset?token=abc{n}def not work?",
    "My account number is 12345{n:04d}99, what is my balance?",
)

FOLLOW_UPS = ("and what about my savings account?", "can you explain that again?", "why?")


def generate_rows(
    until: date,
    days: int = 7,
    intents: int = len(INTENTS),
    users: int = 400,
    asks: int = 3000,
    zipf_s: float = 1.1,
    pii_rows: int = 30,
    multi_turn_rows: int = 40,
    failed_rows: int = 10,
    tail_questions: int = 60,
    salt: bytes = b"edgeqa-sample-salt",
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Log rows (the origin's columns) for ``days`` days ending ``until``, shuffled."""
    rng = random.Random(seed)
    chosen = INTENTS[:intents]
    phrasings = [p for intent in chosen for p in intent]
    weights = [1.0 / (rank + 1) ** zipf_s for rank in range(len(phrasings))]
    order = list(range(len(phrasings)))
    rng.shuffle(order)  # popularity independent of the intent's position
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
    picks = rng.choices(order, weights=weights, k=asks)
    for index in picks:
        rows.append(row(phrasings[index], rng.choice(pool)))
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

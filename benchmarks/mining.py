"""Hot questions published by the nightly mining: k distinct people per wording (the rule before
issue #19) vs k per question with token-level k (the rule now), side by side on the same logs.

Logs: each hot question is asked by 6 to 20 distinct people (``--min-people``, ``--max-people``),
each person typing one of its 3 to 5 wordings, the first ones more often (weights 1, 1/2, 1/3...,
as people do), plus one person per question adding a rare aside (a name) and a long tail of
one-off questions. Two sets of wordings:

- ``sample``: the sample logs' 16 questions (``precompute/samplelogs.py``): three near-duplicate
  wordings and one paraphrase each;
- ``banking77``: 25 intents of banking77 (``../shared/data``, read by path), each asked in
  distinct real wordings of the intent: real paraphrases, far apart (median cosine 0.58 under
  all-MiniLM-L6-v2).

Per system and cluster threshold: ``published`` (hot questions with a published cluster holding
their wordings, over all), ``rows`` (texts published), ``impure_clusters`` (published clusters
holding wordings of two questions), ``held_back`` and ``synthesized`` (rule now only), and
``rare_token_leaks`` (published texts holding a token fewer than k people typed).

Prints one JSON object: {"config": {...}, "logs": {"<set>": {"<system>": {"<threshold>": {...}}}}}

Run: .venv/bin/python benchmarks/mining.py [--thresholds 0.9,0.8,0.7]
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import DATA_DIR

NOW = datetime(2026, 11, 29, tzinfo=UTC)
ASIDES = (", I am Anna Kowalczyk", " - Jan Nowak here", " for my son Piotr")


def banking77_questions(n: int, wordings: int, seed: int) -> list[list[str]]:
    """``n`` banking77 intents (train split), ``wordings`` distinct texts of each."""
    by_intent: dict[str, list[str]] = defaultdict(list)
    with (DATA_DIR / "banking77" / "train.csv").open(encoding="utf-8") as f:
        for row in csv.DictReader(f):
            by_intent[row["category"]].append(row["text"])
    rng = random.Random(seed)
    return [rng.sample(by_intent[i], wordings) for i in rng.sample(sorted(by_intent), n)]


def logs(
    questions: Sequence[Sequence[str]], low: int, high: int, seed: int
) -> list[dict[str, Any]]:
    """Each question asked by ``low`` to ``high`` people over 3+ of its wordings, skewed to the
    first; one person adds an aside; 50 one-off questions."""
    rng = random.Random(seed)
    rows, person = [], 0

    def ask(query: str, user: str) -> None:
        ts = NOW - timedelta(days=rng.uniform(0, 6))
        rows.append(
            {"ts": ts, "user": user, "signed": True, "query": query, "turns": 1, "status": 200}
        )

    for n, wordings in enumerate(questions):
        used = wordings[: rng.randint(3, len(wordings))]
        weights = [1 / (i + 1) for i in range(len(used))]
        for _ in range(rng.randint(low, high)):
            ask(rng.choices(used, weights)[0], f"p{person}")
            person += 1
        ask(used[0].rstrip("?") + ASIDES[n % len(ASIDES)], f"p{person - 1}")
    for n in range(50):
        ask(f"Is the branch at {n} Elm Street open on Sunday?", f"t{n}")
    return rows


def measure(
    rows: list[dict[str, Any]],
    questions: Sequence[Sequence[str]],
    embedder: Any,
    threshold: float,
    k: int,
) -> dict[str, dict[str, Any]]:
    from base.keys import key
    from precompute.config import MiningConfig
    from precompute.mining import mine
    from precompute.textrules import text_problem
    from semantic.guard import content_tokens

    label = {key(w): n for n, wordings in enumerate(questions) for w in wordings}
    typed: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        for token in content_tokens(row["query"]):
            typed[token].add(row["user"])
    rare = {t for t, users in typed.items() if len(users) < k}
    people: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        if not text_problem(row["query"]):  # personal data, time-sensitive: never published
            people[key(row["query"])].add(row["user"])

    # before: a wording is published when k people typed it; clusters of such wordings
    alone = {w for w, users in people.items() if len(users) >= k}
    before = {
        "published": round(len({label[w] for w in alone if w in label}) / len(questions), 3),
        "rows": len(alone),
        "rare_token_leaks": 0,  # a wording k people typed holds no token fewer typed
    }

    config = MiningConfig(k=k, cluster_threshold=threshold)
    hot, report = mine(rows, embedder, config, NOW)
    covered, impure = set(), 0
    for h in hot:
        labels = {label[p.key] for p in h.wordings if p.key in label}
        covered |= labels
        impure += len(labels) > 1
    texts = [p.question for h in hot for p in h.phrasings]
    now = {
        "published": round(len(covered) / len(questions), 3),
        "rows": len(texts),
        "impure_clusters": impure,
        "held_back": report.held_back_phrasings,
        "synthesized": report.synthesized_questions,
        "rare_token_leaks": sum(1 for t in texts if content_tokens(t) & rare),
    }
    return {"k_per_wording": before, "k_per_question": now}


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--thresholds", default="0.9,0.8,0.7", help="cluster cosine thresholds")
    parser.add_argument("--min-people", type=int, default=6)
    parser.add_argument("--max-people", type=int, default=20)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from precompute.samplelogs import INTENTS
    from semantic.loading import load_embedder

    embedder = load_embedder("embedded")
    sets = {"sample": [list(q) for q in INTENTS]}
    if (DATA_DIR / "banking77" / "train.csv").exists():
        sets["banking77"] = banking77_questions(25, 5, args.seed)
    result: dict[str, Any] = {}
    for name, questions in sets.items():
        rows = logs(questions, args.min_people, args.max_people, args.seed)
        by_system: dict[str, dict[str, Any]] = defaultdict(dict)
        for threshold in (float(t) for t in args.thresholds.split(",")):
            measured = measure(rows, questions, embedder, threshold, args.k)
            for system, figures in measured.items():
                by_system[system][str(threshold)] = figures
        result[name] = {"questions": len(questions), "rows": len(rows), **by_system}
    config = {
        "k": args.k,
        "people_per_question": [args.min_people, args.max_people],
        "embedder": "all-MiniLM-L6-v2",
        "seed": args.seed,
    }
    print(json.dumps({"config": config, "logs": result}))


if __name__ == "__main__":
    main()

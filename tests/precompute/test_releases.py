"""``edgeqa release``: list, show, diff and rollback on a folder and on S3, and explain agreeing
with the edge's own lookups."""

from __future__ import annotations

import html
import json
import random
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from base.pointers import verify_pointer
from base.release import ReleaseError, read_pointer
from base.signing import LocalSigner, generate_keypair
from base.store import FileStore, Store
from edge_index.profiles import load_index
from edge_index.server.app import create_app
from edge_index.watcher import EDGE_METRICS, ReleaseWatcher
from precompute.publish import publish
from precompute.releases import (
    RollbackError,
    diff_releases,
    list_releases,
    renew,
    rollback,
    show_release,
)
from precompute.views import describe_semantic_tier
from tests.releases import PROFILE, QUESTIONS, build
from tests.serving import Server
from tests.test_cli import edgeqa_here as _edgeqa

NEW = "How do I order a new card?"


def _two_releases(embedder: Any, store: Store, tmp: Path, signer: Any = None) -> tuple[str, str]:
    build(embedder, tmp / "r1", store, tag="v1")
    first = publish(store, tmp / "r1", signer=signer).version
    # the second: one question dropped, one added, the first one's answer unchanged
    build(
        embedder,
        tmp / "r2",
        store,
        tag="v2",
        now=datetime(2026, 11, 30, tzinfo=UTC),
        questions=(*QUESTIONS[:3], NEW),
        answers={QUESTIONS[0]: f"v1: answer to {QUESTIONS[0]}"},
    )
    return first, publish(store, tmp / "r2", signer=signer).version


def test_list_show_diff_and_rollback(embedder, store: Store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    private, public = generate_keypair()
    first, second = _two_releases(embedder, store, tmp_path, LocalSigner(private))

    listed = list_releases(store, PROFILE)
    assert [r.version for r in listed] == [first, second]
    assert [r.current for r in listed] == [False, True]
    assert listed[1].parent == first and listed[1].entries == 4
    assert listed[1].signed_by and listed[1].calibration.value is not None

    shown = show_release(store, PROFILE, public_keys=(public,), top=2)
    assert shown.version == second and shown.current
    assert shown.counts.rows == 4 and shown.counts.expired == 0
    assert len(shown.top_questions) == 2 and shown.profile.name == PROFILE
    assert shown.excluded.clusters == {}  # every mined cluster had its answer
    with pytest.raises(ReleaseError, match="trusted key"):
        show_release(store, PROFILE, first, public_keys=(generate_keypair()[1],))

    diff = diff_releases(store, PROFILE, first, second, (public,))
    assert diff.counts.model_dump() == {
        "added": 1,
        "dropped": 1,
        "changed": 2,
        "unchanged": 1,
        "phrasings_gained": 0,
        "phrasings_lost": 0,
    }
    assert [c.question for c in diff.added] == [NEW]
    assert [c.question for c in diff.dropped] == [QUESTIONS[3]]
    assert {c.question for c in diff.changed} == set(QUESTIONS[1:3])

    # readers check signatures: a rollback signs the pointer again, so it needs the key
    with pytest.raises(RollbackError, match="EDGEQA_SIGNING_KEY"):
        rollback(store, PROFILE, first, (public,))
    signer = LocalSigner(private)
    before = verify_pointer(read_pointer(store, PROFILE)[0], PROFILE, (public,))
    done = rollback(store, PROFILE, first, (public,), signer)
    assert done == {
        "version": first,
        "previous": second,
        "status": "rolled_back",
        "sequence": done["sequence"],
    }
    pointer, _ = read_pointer(store, PROFILE)
    assert pointer is not None and pointer.version == first
    # signed again under a higher sequence: readers that saw the second release take it
    rolled = verify_pointer(pointer, PROFILE, (public,))
    assert rolled.version == first and rolled.sequence == done["sequence"] > before.sequence
    assert rolled.stale() is None
    assert rollback(store, PROFILE, first, (public,), signer)["status"] == "already_current"
    with pytest.raises(RollbackError, match="not a kept release"):
        rollback(store, PROFILE, "20200101T000000Z-00000000", (public,), signer)
    assert rollback(store, PROFILE, second, (public,), signer)["status"] == "rolled_back"
    # renewing signs the same release again, fresh for as long as asked
    renewed = renew(store, PROFILE, signer, (public,), expires_s=60)
    again = verify_pointer(read_pointer(store, PROFILE)[0], PROFILE, (public,))
    assert (again.version, again.sequence) == (second, renewed["sequence"])
    assert again.sequence > done["sequence"] and again.not_after is not None
    assert 0 < (again.not_after - datetime.now(UTC)).total_seconds() <= 60
    with pytest.raises(RollbackError, match="EDGEQA_SIGNING_KEY"):
        renew(store, PROFILE, None, (public,))


def test_release_commands_on_the_command_line(
    embedder,  # type: ignore[no-untyped-def]
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path / "store")
    first, second = _two_releases(embedder, store, tmp_path)
    env = {**cli_env, "EDGEQA_STORE": str(store.root), "EDGEQA_PROFILE": PROFILE}
    listed = _edgeqa(env, "release", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["version"] for r in json.loads(listed.stdout)] == [first, second]
    listed_text = _edgeqa(env, "release", "list").stdout
    assert f"* {second}" in listed_text and "entries  semantic tier: on  threshold" in listed_text
    shown = _edgeqa(env, "release", "show", first)
    assert shown.returncode == 0 and "top questions" in shown.stdout
    diff = json.loads(_edgeqa(env, "release", "diff", first, second, "--json").stdout)
    assert diff["counts"]["added"] == 1
    explained = _edgeqa(env, "release", "explain", "how can I freeze my card")
    assert explained.returncode == 0, explained.stderr
    assert f"decision: semantic hit -> {QUESTIONS[0]!r}" in explained.stdout
    assert "nearest phrasings:" in explained.stdout and "guard: passed" in explained.stdout
    as_json = _edgeqa(env, "release", "explain", "how can I freeze my card", "--json")
    e = json.loads(as_json.stdout)
    assert e["outcome"] == {**e["outcome"], "hit": True, "tier": "semantic"}, e
    assert e["features"]["score"] >= e["decision"]["threshold"] and e["guard"] == "passed"
    assert set(e["candidates"][0]) == {"key", "question", "cluster", "score"}
    missed = json.loads(_edgeqa(env, "release", "explain", "zebra migration", "--json").stdout)
    assert missed["outcome"]["hit"] is False and set(missed["outcome"]) == {"hit", "reason"}
    refused = _edgeqa(env, "release", "rollback", "nope")
    assert refused.returncode == 2 and "not a kept release" in refused.stderr
    assert "Traceback" not in refused.stderr
    rolled = _edgeqa(env, "release", "rollback", first)
    assert rolled.returncode == 0 and "rolled_back" in rolled.stdout
    renewed = _edgeqa(env, "release", "renew")
    assert renewed.returncode == 0 and f"{first} signed again" in renewed.stdout
    revoked = _edgeqa(
        env, "release", "revoke", "--question", QUESTIONS[1], "--reason", "wrong", "--json"
    )
    assert revoked.returncode == 0, revoked.stderr
    assert json.loads(revoked.stdout)["parent"] == first
    ended = _edgeqa(env, "release", "unrevoke", "--cluster", "nope", "--reason", "x")
    assert ended.returncode == 2 and "no revocation" in ended.stderr


def test_a_release_serving_exact_hits_only_says_so_first(
    embedder,  # type: ignore[no-untyped-def]
    cli_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """A release whose calibration failed has a threshold and a precision, but the edge serves
    no semantic hit from it: ``release list``, ``show`` and the HTML report say so, and why,
    before anything else about its calibration."""
    store = FileStore(tmp_path / "store")
    build(embedder, tmp_path / "r1", store, semantic_uncalibrated=False)
    version = publish(store, tmp_path / "r1").version
    (listed,) = list_releases(store, PROFILE)
    off = describe_semantic_tier(listed.calibration)
    assert off.startswith("semantic tier: OFF (calibration could not show precision"), off
    assert off.endswith(": exact tier only)") and listed.calibration.value is not None
    assert off == describe_semantic_tier(show_release(store, PROFILE).calibration)

    env = {**cli_env, "EDGEQA_STORE": str(store.root), "EDGEQA_PROFILE": PROFILE}
    listed_text = _edgeqa(env, "release", "list")
    assert listed_text.returncode == 0, listed_text.stderr
    assert f"* {version}" in listed_text.stdout
    assert f"4 entries  {off}  threshold " in listed_text.stdout
    page = tmp_path / "report.html"
    shown = _edgeqa(env, "release", "show", "--html", str(page))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines.index(off) < next(i for i, s in enumerate(lines) if s.startswith("calibration:"))
    decision = re.search(r"<th>decision</th><td>(.*?)</td>", page.read_text())
    assert decision is not None and decision[1].startswith(html.escape(f"{off}; threshold "))


def _queries(rng: random.Random, published: tuple[str, ...], n: int) -> list[str]:
    """Published questions reworded at random, and questions about other things."""
    fillers = ["please", "quickly", "today", "again", "my", "the", "new", "online", "100", "UK"]
    others = [
        "What is the capital of France?",
        "Tell me a joke about cats",
        "How do I reset my password?",
        "Where is the nearest branch?",
        "Can I change my PIN?",
    ]
    out = []
    for _ in range(n):
        words = rng.choice(published + tuple(others)).rstrip("?").split()
        for _ in range(rng.randint(0, 3)):
            edit = rng.random()
            if edit < 0.35 and len(words) > 2:
                del words[rng.randrange(len(words))]
            elif edit < 0.7:
                words.insert(rng.randrange(len(words) + 1), rng.choice(fillers))
            else:
                i = rng.randrange(len(words))
                words[i] = words[i].upper() if rng.random() < 0.5 else words[i].lower()
        out.append(" ".join(words) + rng.choice(["?", "", "??", " ?"]))
    return out


def test_explain_agrees_with_the_edge_on_200_random_queries(
    embedder,  # type: ignore[no-untyped-def]
    store: Store,
    tmp_path: Path,
) -> None:
    questions = (*QUESTIONS, "What is the daily limit for 100 pound withdrawals?", NEW)
    build(embedder, tmp_path / "r1", store, questions=questions)
    version = publish(store, tmp_path / "r1").version
    watcher = ReleaseWatcher(store, PROFILE, embedder, 3600, metrics_prefix=EDGE_METRICS)
    assert watcher.refresh()
    index = load_index(store, PROFILE, embedder)  # what `edgeqa release explain` loads
    seen: dict[str, int] = {}
    with Server(create_app(watcher)) as server, httpx.Client(base_url=server.url) as client:
        for query in _queries(random.Random(7), questions, 200):
            explained = index.explain(query)
            assert explained.version == version
            answer = client.post("/v1/lookup", json={"q": query})
            outcome = explained.outcome
            if answer.status_code == 200:
                hit = answer.json()
                assert outcome.hit, (query, hit, explained)
                assert (outcome.tier, outcome.key) == (hit["tier"], hit["key"]), query
                seen[hit["tier"]] = seen.get(hit["tier"], 0) + 1
            else:
                assert answer.status_code == 404, answer.text
                assert not outcome.hit, (query, explained)
                assert outcome.reason == answer.json()["reason"], query
                seen["miss"] = seen.get("miss", 0) + 1
    # the queries exercise every outcome
    assert seen.get("exact", 0) > 5 and seen.get("semantic", 0) > 5 and seen.get("miss", 0) > 5

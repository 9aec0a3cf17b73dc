"""Building small releases for tests, through the real mining and build code."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from base.manifest import Manifest
from base.release import read_pointer
from base.store import Store
from precompute.build import answered, build_release
from precompute.config import BuildConfig, MiningConfig
from precompute.mining import mine
from precompute.questions import HotQuestion

PROFILE = "test-profile"
QUESTIONS = (
    "How do I freeze my card?",
    "What are your opening hours?",
    "How long does a transfer take?",
    "How do I close my account?",
)


def hot_questions(embedder: Any, questions: Sequence[str], now: datetime) -> list[HotQuestion]:
    """``questions`` mined as hot questions, each asked by 5 users at ``now``."""
    rows = [
        {
            "ts": now,
            "user": f"u{i}",
            "signed": True,
            "query": q,
            "turns": 1,
            "tier": "generated",
            "status": 200,
        }
        for q in questions
        for i in range(5)
    ]
    hot, _ = mine(rows, embedder, MiningConfig(cluster_threshold=0.9, k=5), now)
    return hot


def build(
    embedder: Any,
    staging: Path,
    store: Store,
    tag: str = "v1",
    now: datetime | None = None,
    questions: tuple[str, ...] = QUESTIONS,
    answers: dict[str, str] | None = None,
    ttl_days: float = 3650.0,
    semantic_uncalibrated: bool = True,
    profile: str = PROFILE,
    language: str | None = None,
    embedder_name: str = "embedded",
    dated: dict[str, datetime] | None = None,
    **build_kwargs: Any,
) -> Manifest:
    """Build a release of ``questions`` (each asked by 5 users) into ``staging``, on top of the
    store's current release; ``answers``: the answer per question (default: derived text).
    Their semantic tier serves the fallback decision although a handful of phrasings cannot
    calibrate it (``semantic_uncalibrated``; False: off, as a real build of so few would be).
    Answers expire after ``ttl_days``: years by default, so a release built at a fixed date in
    the past is still served when the suite runs (tests of expiry set their own clock).
    ``profile``, ``language`` (recorded in the profile's inputs when given) and
    ``embedder_name`` (what ``EDGEQA_EMBEDDER`` calls ``embedder``) as a nightly run records
    them. ``dated``: when a question's answer was generated, where not ``now`` (an answer a
    night reuses keeps its date)."""
    now = now or datetime(2026, 11, 29, tzinfo=UTC)
    hot = hot_questions(embedder, questions, now)
    generated = {
        h.key: {
            "answer": (answers or {}).get(h.question, f"{tag}: answer to {h.question}"),
            "flag": "",
            "generated_at": (dated or {}).get(h.question, now),
        }
        for h in hot
    }
    pointer, _ = read_pointer(store, profile)
    manifest, _ = build_release(
        staging,
        answered(hot, generated),
        embedder,
        embedder_name,
        profile,
        {"model": "test", **({"language": language} if language else {})},
        BuildConfig(ttl_days=ttl_days, semantic_uncalibrated=semantic_uncalibrated),
        extra={"parent": pointer.version if pointer else None, "run_id": f"run-{tag}"},
        now=now,
        **build_kwargs,
    )
    return manifest


def load_checked(store: Store, profile: str = PROFILE, public_keys: tuple[str, ...] = ()) -> Any:
    """The current release loaded (``load_release``) after it is checked whole where it is
    served, every answer object read back (``check_release(readback=None)``)."""
    from base.release import load_release
    from base.release_check import check_release

    pointer, _ = read_pointer(store, profile)
    assert pointer is not None and pointer.manifest_sha256 is not None
    check_release(
        store, profile, pointer.version, pointer.manifest_sha256, public_keys, readback=None
    )
    return load_release(store, profile, public_keys=public_keys)

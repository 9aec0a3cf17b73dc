"""The tier cascade (``edge_index/tiers.py``): a question keyed once per lookup, and the
release's tiers skipped whole for a caller that has just missed in them. The missed-hint's form
is ``tests/base/test_missed.py``'s."""

from __future__ import annotations

import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from base import keys
from base.store import FileStore
from edge_index import tiers
from edge_index.lookup import Hit, Miss, ReleaseIndex
from precompute.publish import publish
from tests.releases import PROFILE, QUESTIONS, build

OURS = ("base", "edge_index", "semantic", "policy", "origin", "precompute", "edgeqa")


def test_the_edge_keys_a_question_once(embedder, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The lookup handler normalizes and keys the question; the release's exact and semantic
    tiers take that key (a revoked wording is checked by it) rather than compute it again."""
    from starlette.testclient import TestClient

    from edge_index.server.app import create_app
    from edge_index.watcher import EDGE_METRICS, ReleaseWatcher

    store = FileStore(tmp_path / "store")
    build(embedder, tmp_path / "v1", store, tag="v1", now=datetime(2026, 11, 20, tzinfo=UTC))
    publish(store, tmp_path / "v1")
    state = ReleaseWatcher(store, PROFILE, embedder, poll_s=3600, metrics_prefix=EDGE_METRICS)
    assert state.refresh()

    calls: Counter[str] = Counter()
    for name in ("normalize", "key_of_normalized"):
        original = getattr(keys, name)

        def spy(*args: Any, _name: str = name, _original: Any = original, **kw: Any) -> Any:
            calls[_name] += 1
            return _original(*args, **kw)

        for module_name, module in list(sys.modules.items()):
            if module_name.split(".")[0] in OURS and vars(module).get(name) is original:
                monkeypatch.setattr(module, name, spy)

    cases = (
        (QUESTIONS[0], "exact"),
        ("how can I freeze my card", "semantic"),
        ("Tell me a joke about cats", "miss"),  # past both tiers
    )
    with TestClient(create_app(state)) as client:
        for question, tier in cases:
            calls.clear()
            response = client.get("/v1/lookup", params={"q": question})
            assert response.headers["x-edgeqa-tier"] == tier, response.text
            assert calls == {"normalize": 1, "key_of_normalized": 1}, (question, calls)


class _Untouchable:
    """A release whose tiers must not be searched."""

    version = "v1"

    def lookup_exact(self, key: str) -> Hit | None:
        raise AssertionError("the release's exact tier was searched")

    def lookup_semantic(self, *args: Any) -> Hit | Miss:
        raise AssertionError("the release's semantic tier was searched")


@pytest.mark.parametrize("cached", [False, True])
def test_without_the_release_only_the_callers_own_tier_is_tried(cached: bool) -> None:
    """``release=False`` (a client has just missed in this release at the edge): the caller's own
    tier, and a miss that says the release was skipped."""
    own = Hit("origin_cache", "k", "q", "a", 1.0, None)
    index = cast(ReleaseIndex, _Untouchable())

    async def look() -> Hit | Miss:
        return await tiers.lookup(index, "q", "q", "k", lambda key: own if cached else None, False)

    assert anyio.run(look) == (own if cached else Miss("skipped", "v1"))

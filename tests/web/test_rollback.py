"""The rollback attack, end to end: whoever can write the store puts an old, validly signed
``current.json`` back — the release from before a revocation — and no reader serves it again.

Publish v1, revoke one answer (v2), copy v1's signed pointer back over ``current.json``: the edge,
the origin, the Python client and the web client in Chromium keep to v2 and report the stale
pointer, the revoked answer is never served, and a restarted edge still refuses v1."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from base.pointers import PointerMemory
from base.release import pointer_path
from base.signing import LocalSigner, generate_keypair
from base.store import FileStore
from edge_index.releases import Releases
from edge_index.server.app import create_app as edge_app
from edge_index.watcher import EDGE_METRICS, ORIGIN_METRICS, ReleaseWatcher
from edgeqa.client import EdgeQAClient
from edgeqa.demo import cdn_app
from origin.config import OriginSettings
from origin.engine import Engine, EngineConfig
from origin.runtime import Runtime
from origin.server import OriginServer, create_app
from precompute.publish import publish
from precompute.releases import rollback
from precompute.revocations import revoke
from tests.releases import PROFILE, QUESTIONS, build
from tests.serving import Server, wait_healthy
from tests.web.test_web import CHROMIUM, NODE, WEB, _skip_without_a_browser

REVOKED = QUESTIONS[1]
REVOKED_ANSWER = f"v1: answer to {REVOKED}"


def _browser(page: str, *questions: str) -> subprocess.Popen[str]:
    """``web/test/browser.mjs`` asking ``questions`` (``@wait``: waits for a line on stdin)."""
    return subprocess.Popen(
        [str(NODE), "test/browser.mjs", page, *questions],
        cwd=WEB,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CHROMIUM": CHROMIUM},
    )


def _stale(health: dict[str, Any]) -> str:
    pointer = health["pointer"]
    assert pointer["stale"] is True, health
    return str(pointer["stale_reason"])


def test_an_old_signed_pointer_put_back_is_refused_by_every_reader(  # type: ignore[no-untyped-def]
    embedded_model, embedder, tmp_path: Path
) -> None:
    _skip_without_a_browser()
    store = FileStore(tmp_path / "store")
    private, public = generate_keypair()
    signer, keys = LocalSigner(private), (public,)
    build(embedder, tmp_path / "v1", store, tag="v1", now=datetime(2026, 11, 20, tzinfo=UTC))
    publish(store, tmp_path / "v1", signer=signer)
    old_pointer = store.get(pointer_path(PROFILE))  # what the attacker keeps
    v2 = revoke(store, PROFILE, "wrong hours", "alice", question=REVOKED, signer=signer,
                public_keys=keys)["version"]  # fmt: skip
    # v2's pointer, dated a month back: a browser that kept it by heuristic would keep it for
    # days (a tenth of its age), and see no rollback after a reload
    month_ago = datetime.now(UTC).timestamp() - 30 * 86400
    os.utime(store.root / pointer_path(PROFILE), (month_ago, month_ago))

    def watcher(prefix: str, state: str) -> ReleaseWatcher:
        memory = PointerMemory(tmp_path / state)
        return ReleaseWatcher(
            store, PROFILE, embedder, 3600, metrics_prefix=prefix, public_keys=keys, memory=memory
        )

    edge_state, origin_state = watcher(EDGE_METRICS, "edge"), watcher(ORIGIN_METRICS, "origin")
    assert edge_state.refresh() and origin_state.refresh()
    assert edge_state.version == origin_state.version == v2
    model, tokenizer = embedded_model
    engine = Engine(model, tokenizer, EngineConfig(max_num_seqs=4, max_model_len=512))
    with Server(cdn_app(store.root)) as cdn, Server(edge_app(edge_state)) as edge:
        settings = OriginSettings.from_env(
            {
                "EDGEQA_STORE": store.uri,
                "EDGEQA_PROFILE": PROFILE,
                "EDGEQA_CDN_URL": cdn.url,
                "EDGEQA_EDGE_URL": edge.url,
                "EDGEQA_RELEASE_PUBLIC_KEYS": public,
            }
        )
        releases = Releases.of(origin_state)
        server = OriginServer(settings, lambda: Runtime(engine.start(), 32, 0.0, releases))
        with Server(create_app(server)) as origin:
            wait_healthy(origin.url)
            client = EdgeQAClient(
                origin.url, cdn.url, edge.url, PROFILE, public_keys=keys, pointer_ttl_s=0
            )
            assert client.ask(QUESTIONS[0]).source == "cdn"  # v2's pointer, fresh: remembered
            # the page asks under v2, then (the same browser, reloaded) after the attack
            browser = _browser(origin.url, QUESTIONS[0], "@wait", QUESTIONS[0], REVOKED)
            assert browser.stdout is not None and browser.stdin is not None
            assert json.loads(browser.stdout.readline()) == {"waiting": 1}

            store.put(pointer_path(PROFILE), old_pointer)  # the attack
            assert not edge_state.refresh() and not origin_state.refresh()
            assert edge_state.version == origin_state.version == v2  # still served

            browser.stdin.write("go\n")
            browser.stdin.flush()
            out, err = browser.communicate(timeout=300)
            assert browser.returncode == 0, out[-3000:] + err[-3000:]
            report = json.loads(out.strip().splitlines()[-1])
            assert report["errors"] == []
            before, again, revoked = report["results"]
            assert "cdn" in before["label"] and before["pointer"] == "", before
            # refused as a rollback: the page says so and asks the edge, which serves v2
            assert again["pointer"] == "rollback" and "edge" in again["label"], again
            assert revoked["pointer"] == "rollback" and "cdn" not in revoked["label"], revoked
            assert REVOKED_ANSWER not in revoked["answer"]

            after = client.ask(QUESTIONS[0])
            assert after.source == "edge" and client.pointer_problems[PROFILE] == "rollback"
            assert REVOKED_ANSWER not in client.ask(REVOKED).answer

            edge_health = httpx.get(f"{edge.url}/health").json()
            assert edge_health["status"] == "ok" and edge_health["version"] == v2
            assert "refused as a rollback" in _stale(edge_health)
            metrics = httpx.get(f"{edge.url}/metrics").text
            assert f'{EDGE_METRICS}_pointer_stale{{language="en"}} 1.0' in metrics
            assert f'{EDGE_METRICS}_loads_total{{language="en",result="rollback"}} 1.0' in metrics
            origin_health = httpx.get(f"{origin.url}/health").json()
            assert origin_health["release"] == v2
            assert "refused as a rollback" in _stale({"pointer": origin_health["pointers"]["en"]})

    # a restarted edge remembers what it verified: it serves nothing rather than v1
    restarted = watcher(EDGE_METRICS, "edge")
    assert restarted.refresh() is False and restarted.version is None
    assert "refused as a rollback" in _stale(restarted.health())
    # the operator's answer: roll back to v2, signed again under a higher sequence
    assert rollback(store, PROFILE, v2, keys, signer)["status"] == "rolled_back"
    assert restarted.refresh() and restarted.version == v2
    assert edge_state.refresh() is False and edge_state.health()["pointer"]["stale"] is False

"""A revocation under load: 20 clients ask the revoked question without pause through the three
paths a user has — CDN-style reads of ``current.json`` and the answer object, the edge service,
the origin — while ``revoke`` runs. None fails, and none receives the revoked answer later than
one pointer TTL + one poll interval after the revocation returns (the measured bound is printed).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from base.answer_objects import bucket_entry, object_path
from base.keys import key
from base.release import load_release, pointer_path, release_prefix
from base.store import FileStore, ObjectNotFoundError
from edge_index.server.app import create_app as edge_app
from edge_index.watcher import EDGE_METRICS, ORIGIN_METRICS, ReleaseWatcher
from origin.config import OriginSettings
from origin.engine import Engine, EngineConfig
from origin.runtime import Runtime
from origin.server import OriginServer, create_app
from precompute.publish import publish
from precompute.revocations import revoke
from tests.releases import PROFILE, QUESTIONS, build
from tests.serving import Server, wait_healthy

POINTER_TTL_S = 1.0  # how long a CDN-style client keeps current.json (CloudFront: 30 s)
POLL_S = 1.0  # the edge's and the origin's EDGEQA_POLL_S (default 30 s)
REVOKED = QUESTIONS[0]
PARAPHRASE = "How can I freeze my card?"


class CdnClient:
    """Reads like a browser through the CDN: the pointer (kept ``POINTER_TTL_S``), then the
    question's bucket of the key index of the version it names, then the object it lists; a key
    not listed is a miss."""

    def __init__(self, store: FileStore) -> None:
        self.store, self.pointer, self.read_at = store, "", -1e9

    def ask(self, question: str) -> str | None:
        if time.monotonic() - self.read_at > POINTER_TTL_S:
            self.pointer = json.loads(self.store.get(pointer_path(PROFILE)))["version"]
            self.read_at = time.monotonic()
        k = key(question)
        path = f"{release_prefix(PROFILE, self.pointer)}/k/{k[:3]}.json"
        try:
            digest = bucket_entry(json.loads(self.store.get(path)), k)
            if digest is None:
                return None
            return str(json.loads(self.store.get(f"{PROFILE}/{object_path(digest)}"))["answer"])
        except ObjectNotFoundError:
            return None


def test_a_revocation_reaches_every_path_within_the_bound_and_nothing_fails(
    embedded_model,  # type: ignore[no-untyped-def]
    embedder,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path / "store")
    build(embedder, tmp_path / "r1", store, questions=(*QUESTIONS, PARAPHRASE))
    publish(store, tmp_path / "r1")
    # the cluster's answer (generated for its canonical phrasing, whichever of the two that is)
    rows = load_release(store, PROFILE).shards[0].rows.to_pylist()
    revoked_answer = next(r["answer"] for r in rows if r["key"] == key(REVOKED))
    model, tokenizer = embedded_model
    engine = Engine(model, tokenizer, EngineConfig(max_num_seqs=8, max_model_len=512))
    edge_state = ReleaseWatcher(store, PROFILE, embedder, POLL_S, metrics_prefix=EDGE_METRICS)
    edge_state.start()
    settings = OriginSettings.from_env({"EDGEQA_STORE": store.uri, "EDGEQA_PROFILE": PROFILE})
    origin_releases = ReleaseWatcher(
        store, PROFILE, embedder, POLL_S, metrics_prefix=ORIGIN_METRICS
    )
    server = OriginServer(settings, lambda: Runtime(engine.start(), 8, 0.0, origin_releases))
    events: list[tuple[float, str, str | None, str | None]] = []  # (when, path, answer, error)
    lock = threading.Lock()
    stop = threading.Event()
    with Server(edge_app(edge_state)) as edge, Server(create_app(server)) as origin:
        wait_healthy(origin.url)
        edge_http = httpx.Client(base_url=edge.url, timeout=60)
        origin_http = httpx.Client(base_url=origin.url, timeout=120)

        def via_edge(question: str) -> str | None:
            response = edge_http.post("/v1/lookup", json={"q": question})
            if response.status_code == 404:
                return None
            response.raise_for_status()
            return str(response.json()["answer"])

        def via_origin(question: str) -> str | None:
            body = {"messages": [{"role": "user", "content": question}], "max_tokens": 16}
            response = origin_http.post("/v1/chat/completions", json=body)
            response.raise_for_status()
            return str(response.json()["choices"][0]["message"]["content"])

        def client(path: str, ask: Callable[[str], str | None]) -> None:
            asked = 0
            while not stop.is_set():
                question = (REVOKED, PARAPHRASE, QUESTIONS[1])[asked % 3]
                asked += 1
                try:
                    answer, error = ask(question), None
                except Exception as failure:  # every failure is counted, none stops a client
                    answer, error = None, f"{type(failure).__name__}: {failure}"
                with lock:
                    events.append((time.monotonic(), path, answer, error))

        paths: list[tuple[str, Callable[[str], str | None]]] = []
        paths += [("cdn", CdnClient(store).ask) for _ in range(8)]
        paths += [("edge", via_edge) for _ in range(8)]
        paths += [("origin", via_origin) for _ in range(4)]
        threads = [threading.Thread(target=client, args=p, daemon=True) for p in paths]
        for thread in threads:
            thread.start()
        time.sleep(2.0)
        started = time.monotonic()
        done = revoke(store, PROFILE, "wrong answer", "oncall", question=REVOKED)
        revoked_at = time.monotonic()
        time.sleep(POINTER_TTL_S + POLL_S + 6.0)  # past the asserted bound, so a late one shows
        stop.set()
        for thread in threads:
            thread.join(180)
        edge_state.stop()

    failed = [e for e in events if e[3] is not None]
    assert failed == [], failed[:5]
    served = [(when, path) for when, path, answer, _ in events if answer == revoked_answer]
    for path in ("cdn", "edge", "origin"):  # each path served it before: the test tests something
        assert any(p == path and when < started for when, p in served), path
    late = {
        p: max((w - revoked_at for w, q in served if q == p), default=0.0)
        for p in ("cdn", "edge", "origin")
    }
    bound = max(0.0, *late.values())
    print(
        f"\nrevocation: recorded in {done['recorded_s']} s, published {done['version']} in "
        f"{done['seconds']} s; revoked answer last served {bound:.2f} s after revoke returned "
        f"(cdn {late['cdn']:.2f}, edge {late['edge']:.2f}, origin {late['origin']:.2f}); "
        f"bound: pointer TTL {POINTER_TTL_S} s + poll {POLL_S} s; {len(events)} lookups, 0 failed"
    )
    # wide margin for a slow or busy machine: a missed poll shows as more than 5 extra seconds
    assert bound <= POINTER_TTL_S + POLL_S + 5.0

"""The edge index service (Starlette): published answers in milliseconds.

``GET /v1/lookup?q=...``
  200 ``{"answer", "question", "score", "tier", "version", "key"}`` — ``tier`` is ``exact`` (the
  normalized question's key is in the release) or ``semantic`` (FAISS nearest neighbours cleared
  the release's calibrated threshold, margin, agreement and guard);
  404 ``{"miss": true, "version", "reason"}`` — ask the origin;
  400 ``{"error": {"field": "q", "reason", "message"}}`` — empty, over-long or malformed query.
``GET /health``  200 ``{"status": "ok", "version", "entries", "age_s"}`` once a release is
  loaded, 503 ``{"status": "no_release"}`` before.
``GET /metrics`` Prometheus text: lookups by tier and outcome, latency histogram, release
  version, age, entries, and release loads by result.

A background thread polls ``<profile>/current.json`` every ``poll_s`` seconds. A new release is
loaded and verified (every sha256) beside the serving one and swapped in by one reference
assignment, so no lookup fails or waits during a swap; a corrupt release is refused, counted and
logged, and the previous one keeps serving. Lookups are written to the Parquet request logs with
the user as a salted hash.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge_index.keys import InvalidQueryError, key_of_normalized, normalize
from edge_index.logs import LogWriter, hash_user
from edge_index.lookup import Hit, Miss, ReleaseIndex
from edge_index.release import LoadedRelease, ReleaseError, load_release, read_pointer
from edge_index.store import Store, StoreError

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 1.0)


class EdgeMetrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.lookups = Counter(
            "edgeqa_edge_lookups", "Lookups by tier and outcome", ["tier", "outcome"],
            registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "edgeqa_edge_lookup_seconds", "Lookup latency inside the service", ["tier"],
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.release_info = Gauge(
            "edgeqa_edge_release_info", "The release being served (value 1)", ["version"],
            registry=self.registry,
        )  # fmt: skip
        self.release_age = Gauge(
            "edgeqa_edge_release_age_seconds", "Seconds since the served release was built",
            registry=self.registry,
        )  # fmt: skip
        self.release_entries = Gauge(
            "edgeqa_edge_release_entries", "Phrasings in the served release", registry=self.registry
        )
        self.loads = Counter(
            "edgeqa_edge_release_loads", "Release loads by result (ok, refused)", ["result"],
            registry=self.registry,
        )  # fmt: skip


class EdgeState:
    """The served release and the poller that replaces it."""

    def __init__(
        self,
        store: Store,
        profile: str | None,
        embedder: SentenceTransformer,
        poll_s: float = 30.0,
        metrics: EdgeMetrics | None = None,
        warm_up: int = 64,
    ) -> None:
        self.store = store
        self.profile = profile  # None: the store's only profile, once one is published
        self.embedder = embedder
        self.poll_s = poll_s
        self.warm_up = warm_up  # semantic lookups run on a new release before it serves
        self.metrics = metrics or EdgeMetrics()
        self.index: ReleaseIndex | None = None
        self.manifest_sha256: str | None = None
        self._refused: str | None = None  # manifest sha of a refused release: not retried
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._refresh_lock = threading.Lock()

    def refresh(self) -> bool:
        """Load the pointer's release if it is new; True when a new one is now served."""
        with self._refresh_lock:
            if self.profile is None:
                try:
                    self.profile = resolve_profile(self.store, None)
                except ValueError as error:
                    log.info("%s", error)
                    return False
            pointer, _ = read_pointer(self.store, self.profile)
            if pointer is None:
                return False
            wanted = pointer.get("manifest_sha256")
            if wanted == self.manifest_sha256 or (wanted is not None and wanted == self._refused):
                return False
            try:
                release = load_release(self.store, self.profile)
                index = ReleaseIndex(release, self._embedder_for(release))
            except (ReleaseError, StoreError, ValueError, KeyError) as error:
                self._refused = wanted
                self.metrics.loads.labels("refused").inc()
                log.error(
                    "refusing release %s of %s: %s; still serving %s", pointer.get("version"),
                    self.profile, error, self.index.version if self.index else "nothing",
                )  # fmt: skip
                return False
            # warm it before it serves: oneDNN kernels, allocator, the index's pages
            for question in index.questions[: self.warm_up]:
                index.lookup_semantic(question)
            old = self.index
            self.index = index  # one reference assignment: lookups in flight keep the old one
            self.manifest_sha256 = release.manifest_sha256
            self.metrics.loads.labels("ok").inc()
            if old is not None:
                self.metrics.release_info.remove(old.version)
            self.metrics.release_info.labels(index.version).set(1)
            self.metrics.release_entries.set(len(index))
            # the release's millions of objects are long-lived: keep them out of GC passes, which
            # would otherwise scan them in the middle of lookups
            del old
            gc.collect()
            gc.freeze()
            log.info(
                "serving release %s of %s (%d entries)", index.version, self.profile, len(index)
            )
            return True

    def _embedder_for(self, release: LoadedRelease) -> SentenceTransformer:
        """The release's own embedder when it ships one (fine-tuned), else the configured one,
        which must produce vectors of the release's dimension."""
        import tempfile

        from edge_index.embedder import load_embedder

        folder = release.write_embedder(Path(tempfile.mkdtemp(prefix="edgeqa-embedder-")))
        embedder = load_embedder(str(folder)) if folder else self.embedder
        dim = embedder.get_embedding_dimension()
        if dim != release.manifest["embedder"]["dim"]:
            raise ValueError(
                f"the release was embedded with {release.manifest['embedder']['name']!r} "
                f"({release.manifest['embedder']['dim']}-d), the edge's embedder is {dim}-d"
            )
        return embedder

    def age_s(self) -> float | None:
        if self.index is None:
            return None
        created = datetime.fromisoformat(self.index.manifest["created_at"])
        return (datetime.now(UTC) - created).total_seconds()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.refresh()
            except Exception:  # a store outage must not kill the poller
                log.exception("polling %s failed; will retry", self.profile)

    def start(self) -> None:
        try:
            self.refresh()
        except Exception:
            log.exception("initial release load failed; polling")
        self._thread = threading.Thread(target=self._run, name="edgeqa-edge-poll", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


def _error(status: int, field: str, reason: str, message: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"field": field, "reason": reason, "message": message}}, status_code=status
    )


def _user(request: Request) -> str:
    """A salted hash of who asked: the caller's user id header, else the client address."""
    raw = request.headers.get("x-edgeqa-user") or (request.client.host if request.client else "")
    return hash_user(raw)


def create_app(
    state: EdgeState,
    logs: LogWriter | None = None,
    max_query_chars: int = 2048,
) -> Starlette:
    metrics = state.metrics

    def record(request: Request, query: str, normalized: str, tier: str, status: int,
               started: float) -> None:  # fmt: skip
        if logs is None:
            return
        try:
            logs.write(
                user=_user(request), tenant=request.headers.get("x-edgeqa-tenant", ""),
                query=query, normalized=normalized,
                key=key_of_normalized(normalized) if normalized else "", turns=1, tier=tier,
                status=status, latency_ms=(time.perf_counter() - started) * 1000,
                profile=state.profile,
            )  # fmt: skip
        except Exception:  # logging must never fail a lookup
            log.exception("could not log a lookup")

    async def lookup(request: Request) -> Response:
        started = time.perf_counter()
        query = request.query_params.get("q")
        if query is None:
            metrics.lookups.labels("none", "rejected").inc()
            return _error(400, "q", "missing", "query parameter q is required")
        try:
            normalized = normalize(query, max_query_chars)
        except InvalidQueryError as error:
            metrics.lookups.labels("none", "rejected").inc()
            record(request, query[:max_query_chars], "", "rejected", 400, started)
            return _error(400, error.field, error.reason, str(error))
        index = state.index  # one release for the whole lookup, even if a swap happens now
        if index is None:
            metrics.lookups.labels("none", "miss").inc()
            record(request, query, normalized, "miss", 404, started)
            return JSONResponse({"miss": True, "version": None, "reason": "no_release"}, 404)
        result: Hit | Miss | None = index.lookup_exact(key_of_normalized(normalized))
        tier = "exact"
        if result is None:
            tier = "semantic"
            result = await run_in_threadpool(index.lookup_semantic, query, normalized)
        elapsed = time.perf_counter() - started
        metrics.latency.labels(tier).observe(elapsed)
        headers = {"x-edgeqa-tier": result.tier if isinstance(result, Hit) else "miss"}
        if isinstance(result, Miss):
            metrics.lookups.labels(tier, "miss").inc()
            record(request, query, normalized, "miss", 404, started)
            body: dict[str, Any] = {
                "miss": True,
                "version": result.version,
                "reason": result.reason,
            }
            return JSONResponse(body, 404, headers={**headers, "cache-control": "no-store"})
        metrics.lookups.labels(tier, "hit").inc()
        record(request, query, normalized, result.tier, 200, started)
        return JSONResponse(
            {
                "answer": result.answer,
                "question": result.question,
                "score": round(result.score, 4),
                "tier": result.tier,
                "version": result.version,
                "key": result.key,
            },
            headers={**headers, "cache-control": "public, max-age=60"},
        )

    async def health(request: Request) -> Response:
        index = state.index
        if index is None:
            return JSONResponse({"status": "no_release", "profile": state.profile}, 503)
        return JSONResponse(
            {
                "status": "ok",
                "profile": state.profile,
                "version": index.version,
                "entries": len(index),
                "age_s": round(state.age_s() or 0.0, 1),
            }
        )

    async def metrics_endpoint(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        age = state.age_s()
        if age is not None:
            metrics.release_age.set(age)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(404, "path", "not_found", f"no route {request.url.path}")

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return _error(405, "method", "not_allowed", f"{request.method} is not allowed here")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        # uvicorn re-raises SIGTERM once it has shut down: flush here, not after run() returns
        state.stop()
        if logs is not None:
            await run_in_threadpool(logs.close)

    return Starlette(
        lifespan=lifespan,
        routes=[
            Route("/v1/lookup", lookup, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
        ],
        middleware=[
            Middleware(
                CORSMiddleware,
                allow_origins=["*"],
                allow_methods=["GET"],
                expose_headers=["x-edgeqa-tier"],
                max_age=600,
            )
        ],  # public answers: any web page may look them up
        exception_handlers={404: not_found, 405: method_not_allowed},
    )


def resolve_profile(store: Store, profile: str | None) -> str:
    """The configured profile, or the store's only one."""
    if profile:
        return profile
    profiles = sorted({p.split("/", 1)[0] for p in store.list() if p.endswith("/current.json")})
    if len(profiles) == 1:
        return profiles[0]
    if not profiles:
        raise ValueError(
            f"no release published in {store.uri} yet: set EDGEQA_PROFILE (or --profile) to wait "
            "for one"
        )
    raise ValueError(f"{store.uri} holds several profiles {profiles}: set EDGEQA_PROFILE")


def serve(
    store: Store,
    profile: str | None,
    embedder_spec: str,
    host: str,
    port: int,
    poll_s: float,
    max_query_chars: int,
    log_requests: bool = True,
) -> None:
    import faiss
    import uvicorn

    from edge_index.embedder import load_embedder

    # one query per search: FAISS's OpenMP pool would only fight torch's for the cores
    faiss.omp_set_num_threads(1)
    state = EdgeState(store, profile or None, load_embedder(embedder_spec), poll_s)
    logs = LogWriter(store, source="edge") if log_requests else None
    state.start()
    app = create_app(state, logs, max_query_chars)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        state.stop()
        if logs is not None:
            logs.close()

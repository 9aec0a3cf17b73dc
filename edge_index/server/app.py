"""The edge index service (Starlette): published answers in milliseconds.

``GET /v1/lookup?q=...`` (or ``POST /v1/lookup`` with ``{"q": ...}``, which keeps the question
out of URLs and access logs)
  200 ``{"answer", "question", "score", "tier", "version", "key"}`` — ``tier`` is ``exact`` (the
  normalized question's key is in the release) or ``semantic`` (FAISS nearest neighbours cleared
  the release's calibrated threshold, margin, agreement and guard);
  404 ``{"miss": true, "version", "reason", "profile"}`` — ask the origin, saying which release
  missed (``base/missed.py``);
  400 ``{"error": {"field": "q", "reason", "message"}}`` — empty, over-long or malformed query.
``GET /health``  200 ``{"status": "ok", "version", "entries", "age_s"}`` while a release is
  served; 200 ``{"status": "degraded", "reason"}`` while none is (``no_release``, ``refused``,
  ``store_unreachable``): the service is alive and answers every lookup as a miss, so an
  orchestrator must not restart it in a loop. ``GET /ready``: 503 until a release is served.
``GET /metrics`` Prometheus text: lookups by tier and outcome, latency histogram, release
  version, age, entries, and release loads by result; with ``EDGEQA_METRICS_TOKEN`` set, only for
  ``Authorization: Bearer <token>`` (401 otherwise).

The release is the one ``ReleaseWatcher`` (``watcher.py``) serves: polled, verified and swapped in
without failing a lookup. A lookup normalizes and keys the question once, runs the tier cascade
(``tiers.py``) on that key and is written to the Parquet request logs with the user as a salted
hash (``users.py``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from base.bodies import BodyError, parse_body
from base.config import EdgeSettings
from base.credentials import metrics_refusal
from base.keys import MAX_QUERY_CHARS, InvalidQueryError, key_of_normalized, normalize
from base.logs import LogWriter, open_log_writer
from base.users import UserHasher, user_hasher
from edge_index import tiers
from edge_index.lookup import Hit, Miss
from edge_index.releases import Releases
from edge_index.watcher import EDGE_METRICS, ReleaseWatcher

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 1.0)


class EdgeMetrics:
    """Lookups by tier and outcome, their latency, and the served release (``edgeqa_edge_*``)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self.lookups = Counter(
            "edgeqa_edge_lookups",
            "Lookups by tier and outcome",
            ["tier", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "edgeqa_edge_lookup_seconds",
            "Lookup latency inside the service",
            ["tier"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )


def _error(status: int, field: str, reason: str, message: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"field": field, "reason": reason, "message": message}}, status_code=status
    )


async def _posted_query(
    request: Request, max_query_chars: int
) -> tuple[str | None, Any, Response | None]:
    """``q`` and ``profile`` of a POSTed ``{"q": ..., "profile": ...}`` (a question kept out of
    URLs and so out of access logs); or the 4xx that refuses the body."""
    limit = max_query_chars * 4 + 1024  # the longest question, UTF-8 and JSON-escaped, and room
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None, None, _error(413, "body", "too_large", f"the body exceeds {limit} bytes")
        chunks.append(chunk)
    try:
        body = parse_body(b"".join(chunks))
    except BodyError as error:  # not JSON, or a value no field takes (bodies.py): named
        return None, None, _error(400, error.field, error.reason, str(error))
    if not isinstance(body, dict):
        message = 'the body must be a JSON object: {"q": "..."}'
        return None, None, _error(400, "body", "invalid", message)
    query = body.get("q")
    if query is not None and not isinstance(query, str):
        return None, None, _error(400, "q", "invalid", "q must be a string")
    return query, body.get("profile"), None


def _profile_problem(profile: Any, releases: Releases) -> Response | None:
    """The 400 for a ``profile`` that is not one this service serves; None when it is (or none
    was named)."""
    if profile is None or profile == "":
        return None
    served = sorted(p for p in releases.profiles().values() if p)
    if not isinstance(profile, str) or profile not in served:
        message = f"profile must be one this service serves: {', '.join(served) or 'none yet'}"
        return _error(400, "profile", "unknown", message)
    return None


def create_app(
    releases: Releases | ReleaseWatcher,
    logs: LogWriter | None = None,
    max_query_chars: int = MAX_QUERY_CHARS,
    users: UserHasher | None = None,
    metrics_token: str = "",
) -> Starlette:
    """The service over ``releases`` (one watcher: a single profile); ``metrics_token``: the
    bearer token ``/metrics`` asks for ("": open)."""
    served = Releases.of(releases) if isinstance(releases, ReleaseWatcher) else releases
    metrics = EdgeMetrics()
    metrics.registry.register(served.metrics.registry)
    if logs is not None:
        metrics.registry.register(logs.registry)
    users = users or UserHasher()

    def record(
        request: Request,
        query: str,
        normalized: str,
        key: str,
        tier: str,
        status: int,
        started: float,
        profile: str | None,
    ) -> None:
        if logs is None:
            return
        try:
            asker = users.of_request(request)
            logs.write(
                **asker.log_fields(),
                tenant=users.tenant(request),
                query=query,
                normalized=normalized,
                key=key,
                turns=1,
                tier=tier,
                status=status,
                latency_ms=(time.perf_counter() - started) * 1000,
                profile=profile,
            )
        except Exception:  # logging must never fail a lookup
            log.exception("could not log a lookup")

    async def lookup(request: Request) -> Response:
        started = time.perf_counter()
        if request.method == "POST":
            query, profile, refused = await _posted_query(request, max_query_chars)
            if refused is not None:
                metrics.lookups.labels("none", "rejected").inc()
                return refused
        else:
            query, profile = request.query_params.get("q"), request.query_params.get("profile")
        if query is None:
            metrics.lookups.labels("none", "rejected").inc()
            return _error(400, "q", "missing", "query parameter q is required")
        refused = _profile_problem(profile, served)
        if refused is not None:
            metrics.lookups.labels("none", "rejected").inc()
            return refused
        try:
            normalized = normalize(query, max_query_chars)
        except InvalidQueryError as error:
            metrics.lookups.labels("none", "rejected").inc()
            record(request, query[:max_query_chars], "", "", "rejected", 400, started, None)
            return _error(400, error.field, error.reason, str(error))
        watcher = served.for_question(query, profile)
        # one release for the whole lookup, even if a swap happens now
        index = watcher.index if watcher is not None else None
        served_profile = watcher.profile if watcher is not None else None
        key = key_of_normalized(normalized)  # once: every tier looks up by it
        result = await tiers.lookup(index, query, normalized, key)
        if watcher is None and isinstance(result, Miss):
            result = Miss("language_not_served", None)
        # the tier that decided: a hit's, else the last one tried
        tier = result.tier if isinstance(result, Hit) else "semantic" if index else "none"
        if index is not None:
            metrics.latency.labels(tier).observe(time.perf_counter() - started)
        if isinstance(result, Miss):
            metrics.lookups.labels(tier, "miss").inc()
            record(request, query, normalized, key, "miss", 404, started, served_profile)
            # the release searched: a client says so to the origin (base.missed.missed_hint)
            body: dict[str, Any] = {
                "miss": True,
                "version": result.version,
                "reason": result.reason,
                "profile": served_profile if result.version else None,
            }
            headers = {"x-edgeqa-tier": "miss", "cache-control": "no-store"}
            return JSONResponse(body, 404, headers=headers if index else None)
        metrics.lookups.labels(tier, "hit").inc()
        record(request, query, normalized, key, result.tier, 200, started, served_profile)
        return JSONResponse(
            {
                "answer": result.answer,
                "question": result.question,
                "score": round(result.score, 4),
                "tier": result.tier,
                "version": result.version,
                "key": result.key,
                "profile": served_profile,
            },
            headers={"x-edgeqa-tier": result.tier, "cache-control": "public, max-age=60"},
        )

    async def health(request: Request) -> Response:
        return JSONResponse(served.health())

    async def ready(request: Request) -> Response:
        state = served.health()
        return JSONResponse(state, 200 if state["status"] == "ok" else 503)

    async def metrics_endpoint(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        problem = metrics_refusal(request, metrics_token)
        if problem is not None:
            status, message = problem
            if status != 401:
                return _error(status, "client", "forbidden", message)
            refused = _error(401, "authorization", "unauthorized", message)
            refused.headers["www-authenticate"] = "Bearer"
            return refused
        served.observe_age()
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(404, "path", "not_found", f"no route {request.url.path}")

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return _error(405, "method", "not_allowed", f"{request.method} is not allowed here")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        # uvicorn re-raises SIGTERM once it has shut down: flush here, not after run() returns
        served.stop()
        if logs is not None:
            await run_in_threadpool(logs.close)

    return Starlette(
        lifespan=lifespan,
        routes=[
            Route("/v1/lookup", lookup, methods=["GET", "POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/ready", ready, methods=["GET"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
        ],
        middleware=[
            Middleware(
                CORSMiddleware,
                allow_origins=["*"],
                allow_methods=["GET", "POST"],
                # the signed user token, and a POSTed question's JSON
                allow_headers=["x-edgeqa-user", "x-edgeqa-tenant", "content-type"],
                expose_headers=["x-edgeqa-tier"],
                max_age=600,
            )
        ],  # public answers: any web page may look them up
        exception_handlers={404: not_found, 405: method_not_allowed},
    )


def serve(settings: EdgeSettings, host: str, port: int, log_requests: bool = True) -> None:
    import faiss
    import uvicorn

    from base.store import open_store

    # one query per search: FAISS's OpenMP pool would only fight torch's for the cores
    faiss.omp_set_num_threads(1)
    store = open_store(settings.store)
    releases = Releases.from_settings(settings, EDGE_METRICS, store=store)
    logs = open_log_writer(store, "edge", settings) if log_requests else None
    releases.start()
    users = user_hasher(settings)
    app = create_app(releases, logs, settings.max_query_chars, users, settings.metrics_token)
    try:
        # who the viewer is comes from EDGEQA_TRUSTED_PROXIES (users.py), never uvicorn's guess
        uvicorn.run(app, host=host, port=port, log_level="warning", proxy_headers=False)
    finally:
        releases.stop()
        if logs is not None:
            logs.close()

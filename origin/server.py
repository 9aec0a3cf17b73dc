"""The origin server (Starlette): an OpenAI-compatible API in front of the engine.

``POST /v1/chat/completions`` and ``POST /v1/completions`` stream (SSE, ``data: [DONE]`` last)
or answer whole. Before generating, a single-turn chat question with default sampling and no
personal data is looked up in the current release (exact key, then semantic with the release's
calibrated decision and guard) and in the online cache of answers generated recently; a hit is
sent in the same format, with ``x-edgeqa-tier`` saying where it came from (``exact``,
``semantic``, ``origin_cache`` or ``generated``).

Admission is bounded (waiting requests and their prompt tokens; optionally per user): past the
bound a request gets 429 with ``Retry-After`` at once instead of a growing queue. A client that
disconnects cancels its request, which leaves the engine at the next step. Every request is
logged to the Parquet request log with the user as a salted hash. ``GET /health`` is 503 while
the model loads, after the engine loop died and while draining; ``GET /metrics`` is Prometheus
text with vLLM's metric names (``origin/metrics.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from edge_index.keys import InvalidQueryError, key_of_normalized, normalize
from edge_index.logs import LogWriter, hash_user
from edge_index.lookup import Hit
from edge_index.pii import has_pii
from origin.cache import OnlineCache
from origin.config import ServerConfig
from origin.metrics import OriginMetrics
from origin.protocol import APIError, ParsedRequest, parse_chat, parse_completion, parse_json

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from edge_index.service import EdgeState
    from origin.engine import Engine
    from origin.engine.engine import OutputStream
    from origin.engine.request import RequestOutput

log = logging.getLogger(__name__)

SSE_HEADERS = {"cache-control": "no-store", "x-accel-buffering": "no"}


@dataclass
class Runtime:
    """What loading produces: a started engine, and the release poller when tiers are on."""

    engine: Engine
    default_max_tokens: int
    default_temperature: float
    releases: EdgeState | None = None

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.config.max_model_len


@dataclass
class Answer:
    """A cache or release hit, ready to be sent."""

    tier: str
    text: str
    completion_tokens: int
    finish_reason: str


class OriginServer:
    def __init__(
        self,
        config: ServerConfig,
        load: Callable[[], Runtime],
        model_name: str,
        logs: LogWriter | None = None,
        cache: OnlineCache | None = None,
    ) -> None:
        self.config = config
        self.load = load
        self.model_name = model_name
        self.logs = logs
        self.cache = cache or OnlineCache(
            config.cache_ttl_s, config.cache_jitter, config.cache_max_bytes
        )
        self.metrics = OriginMetrics(model_name)
        self.metrics.watch(
            lambda: self.runtime.engine if self.runtime else None,
            self.cache,
            self._release_version,
        )
        self.runtime: Runtime | None = None
        self.load_error: BaseException | None = None
        self.draining = False
        self.created = int(time.time())
        self._in_flight: dict[str, int] = {}  # user hash -> requests admitted to the engine
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._service_s = 2.0  # EMA of generated requests' e2e latency, for Retry-After

    # -- loading and state ------------------------------------------------------------------------

    def start_loading(self) -> threading.Thread:
        def run() -> None:
            try:
                runtime = self.load()
                if runtime.releases is not None:
                    runtime.releases.start()
                self.runtime = runtime
                log.info("origin ready: serving %s", self.model_name)
            except BaseException as error:
                self.load_error = error
                log.exception("loading the origin failed")

        thread = threading.Thread(target=run, name="edgeqa-origin-load", daemon=True)
        thread.start()
        return thread

    def _release_version(self) -> str | None:
        runtime = self.runtime
        if runtime is None or runtime.releases is None or runtime.releases.index is None:
            return None
        return runtime.releases.index.version

    def health(self) -> tuple[int, dict[str, Any]]:
        if self.load_error is not None:
            return 503, {"status": "failed", "error": repr(self.load_error)}
        runtime = self.runtime
        if runtime is None:
            return 503, {"status": "loading"}
        if not runtime.engine.alive:
            error = runtime.engine.loop_error
            return 503, {"status": "engine_dead", "error": repr(error) if error else None}
        if self.draining:
            return 503, {"status": "draining"}
        waiting, tokens = runtime.engine.queue_load()
        return 200, {
            "status": "ok",
            "model": self.model_name,
            "release": self._release_version(),
            "running": runtime.engine.num_running,
            "waiting": waiting,
            "queued_prompt_tokens": tokens,
        }

    def ready_runtime(self) -> Runtime:
        status, body = self.health()
        if status != 200:
            raise APIError(
                503, f"the origin is not ready: {body['status']}", None, "service_unavailable",
                headers={"retry-after": "5"},
            )  # fmt: skip
        assert self.runtime is not None
        return self.runtime

    # -- request helpers --------------------------------------------------------------------------

    def authorize(self, request: Request) -> None:
        keys = [hashlib.sha256(k.encode()).digest() for k in self.config.api_keys]
        if not keys:
            return
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header[:7].lower() == "bearer " else ""
        token = token or request.headers.get("x-api-key", "")
        digest = hashlib.sha256(token.encode()).digest()
        ok = False
        for key in keys:  # every key compared, in constant time each
            ok |= hmac.compare_digest(digest, key)
        if not ok:
            raise APIError(
                401, "missing or invalid API key", None, "authentication_error", "invalid_api_key",
                headers={"www-authenticate": "Bearer"},
            )  # fmt: skip

    async def read_body(self, request: Request) -> dict[str, Any]:
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise APIError(413, f"the body exceeds {limit} bytes", "body", code="body_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise APIError(
                    413, f"the body exceeds {limit} bytes", "body", code="body_too_large"
                )
            chunks.append(chunk)
        return parse_json(b"".join(chunks))

    def user_of(self, request: Request, parsed: ParsedRequest | None) -> str:
        raw = (
            request.headers.get("x-edgeqa-user")
            or (parsed.user if parsed is not None else None)
            or (request.client.host if request.client else "")
        )
        return hash_user(raw)

    def retry_after(self) -> str:
        runtime = self.runtime
        waiting = runtime.engine.queue_load()[0] if runtime else 0
        slots = runtime.engine.config.max_num_seqs if runtime else 1
        return str(max(1, min(60, math.ceil(self._service_s * (1 + waiting / slots)))))

    def admit(self, context: _Context, prompt_ids: list[int]) -> OutputStream:
        """Refuse (429) when the queue is full; otherwise queue the request in the engine now
        (so that the next request's check sees it) and count the user's request in flight."""
        runtime, user, prompt_tokens = context.runtime, context.user, len(prompt_ids)
        engine = runtime.engine
        waiting, queued_tokens = engine.queue_load()
        # requests that a free slot takes at the next step are not queued behind anyone
        free = max(0, engine.config.max_num_seqs - engine.num_running)
        reason = None
        if waiting >= self.config.max_queued_requests + free:
            reason = "queue_full"
        elif queued_tokens and queued_tokens + prompt_tokens > self.config.max_queued_tokens:
            reason = "queued_tokens_full"
        with self._lock:
            per_user = self.config.max_in_flight_per_user
            if reason is None and per_user and self._in_flight.get(user, 0) >= per_user:
                reason = "user_limit"
            if reason is None:
                self._in_flight[user] = self._in_flight.get(user, 0) + 1
        if reason is None:
            try:
                return context.open(prompt_ids)
            except BaseException:
                self.release_user(user)
                raise
        self.metrics.rejected.labels(reason).inc()
        raise APIError(
            429, f"the origin is at capacity ({reason}); retry later", None, "rate_limit_exceeded",
            reason, headers={"retry-after": self.retry_after()},
        )  # fmt: skip

    def release_user(self, user: str) -> None:
        with self._lock:
            left = self._in_flight.get(user, 0) - 1
            if left > 0:
                self._in_flight[user] = left
            else:
                self._in_flight.pop(user, None)

    def write_log(self, **row: Any) -> None:
        if self.logs is None:
            return
        try:
            runtime = self.runtime
            releases = runtime.releases if runtime else None
            row.setdefault("profile", (releases.profile if releases else None) or "")
            self.logs.write(**row)
        except Exception:  # logging must never fail a request
            log.exception("could not log a request")

    # -- the tiers ------------------------------------------------------------------------------

    def cache_key(self, parsed: ParsedRequest) -> tuple[str, str] | None:
        """(normalized question, key) when the request may use caches, else None."""
        if not parsed.single_question or not parsed.default_sampling:
            return None
        systems = [m["content"] for m in parsed.messages if m["role"] == "system"]
        if systems and systems != [self.config.system_prompt]:
            return None  # other instructions, other answers
        question = parsed.question
        try:
            normalized = normalize(question)
        except InvalidQueryError:
            return None
        if has_pii(question):
            return None
        return normalized, key_of_normalized(normalized)

    async def lookup(
        self, runtime: Runtime, parsed: ParsedRequest, normalized: str, key: str
    ) -> Answer | None:
        releases = runtime.releases
        index = releases.index if releases is not None else None
        hit: Hit | None = index.lookup_exact(key) if index is not None else None
        cached = self.cache.get(key) if hit is None else None
        if cached is not None:
            return self._fit(
                runtime, parsed, "origin_cache", cached.answer, cached.completion_tokens
            )
        if hit is None and index is not None:
            found = await run_in_threadpool(index.lookup_semantic, parsed.question, normalized)
            hit = found if isinstance(found, Hit) else None
        if hit is None:
            return None
        return self._fit(runtime, parsed, hit.tier, hit.answer)

    def _fit(
        self, runtime: Runtime, parsed: ParsedRequest, tier: str, text: str,
        tokens: int | None = None,
    ) -> Answer:  # fmt: skip
        """The stored answer as this request would have been answered: cut at max_tokens.
        ``tokens``: its length when known (the online cache's), which spares tokenizing it."""
        limit = parsed.params.max_tokens
        if tokens is not None and tokens <= limit:
            return Answer(tier, text, tokens, "stop")
        ids = runtime.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= limit:
            return Answer(tier, text, len(ids), "stop")
        cut = str(runtime.tokenizer.decode(ids[:limit], skip_special_tokens=True))
        return Answer(tier, cut, limit, "length")

    # -- prompts ----------------------------------------------------------------------------------

    def prompt_ids(self, runtime: Runtime, parsed: ParsedRequest) -> list[int]:
        if parsed.kind == "chat":
            messages = parsed.messages
            if self.config.system_prompt and not any(m["role"] == "system" for m in messages):
                messages = [{"role": "system", "content": self.config.system_prompt}, *messages]
            ids = runtime.engine.encode(messages)
            field = "messages"
        elif isinstance(parsed.prompt, str):
            ids = runtime.tokenizer.encode(parsed.prompt, add_special_tokens=False)
            field = "prompt"
        else:
            vocab = len(runtime.tokenizer)
            if max(parsed.prompt) >= vocab:
                raise APIError(400, f"token ids must be below {vocab}", "prompt")
            ids, field = list(parsed.prompt), "prompt"
        if not ids:
            raise APIError(400, "the prompt encodes to no tokens", field)
        limit = runtime.max_model_len
        if len(ids) >= limit:
            raise APIError(
                400, f"the prompt has {len(ids)} tokens; the context is {limit}", field,
                code="context_length_exceeded",
            )  # fmt: skip
        room = limit - len(ids)
        if parsed.params.max_tokens > room:
            if parsed.max_tokens_given:
                name = "max_completion_tokens" if parsed.kind == "chat" else "max_tokens"
                raise APIError(
                    400, f"prompt ({len(ids)} tokens) + {parsed.params.max_tokens} exceeds the "
                    f"context of {limit} tokens", name, code="context_length_exceeded",
                )  # fmt: skip
            parsed.params = replace(parsed.params, max_tokens=room)
        return ids


# -- response bodies ------------------------------------------------------------------------------


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


class Shaper:
    """The OpenAI JSON of one request: chunks while streaming, or the whole response."""

    def __init__(self, kind: str, request_id: str, model: str, created: int) -> None:
        self.kind = kind
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + request_id
        self.model = model
        self.created = created
        self.object = "chat.completion" if kind == "chat" else "text_completion"

    def _head(self, chunk: bool) -> dict[str, Any]:
        obj = self.object + (".chunk" if chunk and self.kind == "chat" else "")
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def chunk(self, text: str | None, finish_reason: str | None, role: bool = False) -> bytes:
        if self.kind == "chat":
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None}
        choice["finish_reason"] = finish_reason
        return _sse({**self._head(True), "choices": [choice]})

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        return _sse(
            {**self._head(True), "choices": [], "usage": _usage(prompt_tokens, completion_tokens)}
        )

    def whole(
        self, text: str, finish_reason: str | None, prompt_tokens: int, completion_tokens: int
    ) -> dict[str, Any]:
        if self.kind == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {
            **self._head(False),
            "choices": [choice],
            "usage": _usage(prompt_tokens, completion_tokens),
        }


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _finish_reason(reason: str | None) -> str | None:
    """The engine's reasons in OpenAI's words (``abort`` and ``error`` never reach a client)."""
    return reason if reason in ("stop", "length") else None


# -- the app --------------------------------------------------------------------------------------


def create_app(server: OriginServer) -> Starlette:
    metrics = server.metrics
    config = server.config

    async def completions(request: Request, kind: str) -> Response:
        arrival = time.monotonic()
        request_id = uuid.uuid4().hex[:24]
        parsed: ParsedRequest | None = None
        row: dict[str, Any] = {"request_id": request_id, "turns": 1, "query": ""}
        try:
            server.authorize(request)
            runtime = server.ready_runtime()
            body = await server.read_body(request)
            parse = parse_chat if kind == "chat" else parse_completion
            parsed = parse(
                body, runtime.max_model_len, runtime.default_max_tokens,
                runtime.default_temperature,
            )  # fmt: skip
            row.update(turns=parsed.turns, query=parsed.question[:4096])
            if parsed.model is not None and parsed.model != server.model_name:
                raise APIError(
                    404, f"the model {parsed.model!r} does not exist; this origin serves "
                    f"{server.model_name!r}", "model", "invalid_request_error", "model_not_found",
                )  # fmt: skip
            prompt_ids = server.prompt_ids(runtime, parsed)
        except ClientDisconnect:
            return Response(status_code=499)
        except APIError as error:
            reason = {401: "unauthorized", 413: "too_large", 503: "not_ready"}.get(
                error.status, "invalid"
            )
            metrics.rejected.labels(reason).inc()
            metrics.requests.labels("rejected", str(error.status)).inc()
            server.write_log(
                **row, user=server.user_of(request, parsed), tenant=_tenant(request),
                tier="rejected", status=error.status, latency_ms=_ms(arrival),
            )  # fmt: skip
            return error.response()

        user = server.user_of(request, parsed)
        shaper = Shaper(kind, request_id, server.model_name, int(time.time()))
        context = _Context(server, runtime, parsed, shaper, request_id, user, arrival, row)
        context.row.update(user=user, tenant=_tenant(request))

        cacheable = server.cache_key(parsed) if config.tiers else None
        if cacheable is not None:
            normalized, key = cacheable
            context.row.update(normalized=normalized, key=key)
            try:
                answer = await server.lookup(runtime, parsed, normalized, key)
            except Exception:  # a broken release or cache must not fail the request: generate
                log.exception("origin tier lookup failed; generating")
                answer = None
            if answer is not None:
                return context.send_answer(answer, len(prompt_ids))
            context.cache_key = key

        try:
            outputs = server.admit(context, prompt_ids)
        except APIError as error:
            metrics.requests.labels("rejected", "429").inc()
            server.write_log(**context.row, tier="rejected", status=429, latency_ms=_ms(arrival))
            return error.response()
        if parsed.stream:
            return _ClosingStream(
                context.stream(outputs, prompt_ids), lambda: context.abandon(outputs, prompt_ids),
                media_type="text/event-stream",
                headers={**SSE_HEADERS, "x-edgeqa-tier": "generated", "x-request-id": request_id},
            )  # fmt: skip
        return await context.whole(request, outputs, prompt_ids)

    async def chat(request: Request) -> Response:
        return await completions(request, "chat")

    async def completion(request: Request) -> Response:
        return await completions(request, "completion")

    async def models(request: Request) -> Response:
        try:
            server.authorize(request)
        except APIError as error:
            return error.response()
        runtime = server.runtime
        card: dict[str, Any] = {
            "id": server.model_name,
            "object": "model",
            "created": server.created,
            "owned_by": "edgeqa",
        }
        if runtime is not None:
            card["max_model_len"] = runtime.max_model_len
        return JSONResponse({"object": "list", "data": [card]})

    async def health(request: Request) -> Response:
        status, body = server.health()
        return JSONResponse(body, status_code=status)

    async def metrics_endpoint(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def web_config(request: Request) -> Response:
        """Where the web client finds the CDN, the edge and the release profile."""
        runtime = server.runtime
        releases = runtime.releases if runtime else None
        return JSONResponse(
            {
                "cdn": config.cdn_url, "edge": config.edge_url,
                "profile": (releases.profile if releases else None) or config.profile,
                "model": server.model_name,
            },
            headers={"cache-control": "no-store"},
        )  # fmt: skip

    async def page(request: Request) -> Response:
        index = Path(config.web_dir) / "index.html"
        if not index.is_file():
            return APIError(404, "the web client is not installed here", "path").response()
        return FileResponse(index, headers={"cache-control": "no-cache"})

    async def not_found(request: Request, exc: Exception) -> Response:
        return APIError(404, f"no route {request.url.path}", "path").response()

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return APIError(405, f"{request.method} is not allowed here", "method").response()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        server.start_loading()  # /health says "loading" until the engine is up
        yield
        # uvicorn has waited (timeout_graceful_shutdown) for requests in flight; what is left
        # is cancelled with the engine, and the logs are flushed
        server.draining = True
        await run_in_threadpool(_shutdown, server)

    return Starlette(
        lifespan=lifespan,
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completion, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
            Route("/config.json", web_config, methods=["GET"]),
            Route("/", page, methods=["GET"]),
            Mount("/web", StaticFiles(directory=config.web_dir, check_dir=False), name="web"),
        ],
        middleware=[cors_middleware()],
        exception_handlers={404: not_found, 405: method_not_allowed},
    )


def cors_middleware() -> Middleware:
    """Browsers on any site may call the API (keys, not origins, guard it) and read the tier."""
    return Middleware(
        CORSMiddleware, allow_origins=["*"], allow_methods=["GET", "POST"],
        allow_headers=["*"], expose_headers=["x-edgeqa-tier", "x-request-id", "retry-after"],
        max_age=600,
    )  # fmt: skip


def _shutdown(server: OriginServer) -> None:
    runtime = server.runtime
    if runtime is not None:
        if runtime.releases is not None:
            runtime.releases.stop()
        runtime.engine.stop()
    if server.logs is not None:
        server.logs.close()


def _tenant(request: Request) -> str:
    return request.headers.get("x-edgeqa-tenant", "")[:128]


def _ms(since: float) -> float:
    return (time.monotonic() - since) * 1000


class _Context:
    """One admitted request: runs it on the engine, sends it, measures and logs it."""

    def __init__(
        self,
        server: OriginServer,
        runtime: Runtime,
        parsed: ParsedRequest,
        shaper: Shaper,
        request_id: str,
        user: str,
        arrival: float,
        row: dict[str, Any],
    ) -> None:
        self.server = server
        self.runtime = runtime
        self.parsed = parsed
        self.shaper = shaper
        self.request_id = request_id
        self.user = user
        self.arrival = arrival
        self.row = row
        self.cache_key: str | None = None
        self.metrics = server.metrics
        self.state = _Outcome()
        self._finished = False

    # -- hits -------------------------------------------------------------------------------------

    def send_answer(self, answer: Answer, prompt_tokens: int) -> Response:
        tier, shaper = answer.tier, self.shaper
        headers = {"x-edgeqa-tier": tier, "x-request-id": self.request_id}
        self.metrics.requests.labels(tier, "200").inc()
        self.metrics.tier_ttft.labels(tier).observe(time.monotonic() - self.arrival)
        self.server.write_log(
            **self.row, tier=tier, status=200, latency_ms=_ms(self.arrival),
            ttft_ms=_ms(self.arrival),
        )  # fmt: skip
        if not self.parsed.stream:
            body = shaper.whole(answer.text, answer.finish_reason, prompt_tokens,
                                answer.completion_tokens)  # fmt: skip
            return JSONResponse(body, headers=headers)

        async def events() -> AsyncIterator[bytes]:
            first = True
            chat = self.parsed.kind == "chat"
            for piece in _pieces(answer.text):
                yield shaper.chunk(piece, None, role=first and chat)
                first = False
            yield shaper.chunk("", answer.finish_reason)
            if self.parsed.include_usage:
                yield shaper.usage_chunk(prompt_tokens, answer.completion_tokens)
            yield DONE

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={**SSE_HEADERS, **headers}
        )

    # -- generation -------------------------------------------------------------------------------

    def open(self, prompt_ids: list[int]) -> OutputStream:
        """Queue the request in the engine, within the request timeout (counted from arrival)."""
        timeout = self.server.config.request_timeout_s - (time.monotonic() - self.arrival)
        return self.runtime.engine.open_stream(
            prompt_ids, self.parsed.params, self.request_id, self.arrival, max(0.0, timeout)
        )

    def abandon(self, outputs: OutputStream, prompt_ids: list[int]) -> None:
        """The response is over (sent, failed, or never started): cancel what is left."""
        if not self._finished:
            outputs.close()
            self.state.cancelled = self.state.finish_reason is None
            self.finish(self.state, prompt_ids, streamed=True)

    async def stream(self, outputs: OutputStream, prompt_ids: list[int]) -> AsyncIterator[bytes]:
        shaper, chat = self.shaper, self.parsed.kind == "chat"
        state = self.state
        try:
            async for output in outputs:
                state.take(output)
                if output.error is not None:
                    yield _sse({"error": {"message": "generation failed", "type": "server_error",
                                          "param": None, "code": None}})  # fmt: skip
                    break
                if output.delta_text or (state.first_sent is None and output.finished):
                    yield shaper.chunk(output.delta_text, None, role=chat and not state.chunks)
                    state.chunks += 1
                    if state.first_sent is None:
                        state.first_sent = time.monotonic()  # resumed: the bytes were sent
                if output.finished:
                    yield shaper.chunk("", _finish_reason(output.finish_reason))
                    if self.parsed.include_usage:
                        yield shaper.usage_chunk(len(prompt_ids), output.completion_tokens)
                    yield DONE
        except TimeoutError:
            state.timed_out = True
            yield _sse({"error": {"message": "the request timed out", "type": "timeout",
                                  "param": None, "code": "timeout"}})  # fmt: skip
            yield DONE
        except asyncio.CancelledError:
            state.cancelled = True
            raise
        finally:
            outputs.close()
            self.finish(state, prompt_ids, streamed=True)

    async def whole(
        self, request: Request, outputs: OutputStream, prompt_ids: list[int]
    ) -> Response:
        state = _Outcome()
        texts: list[str] = []

        async def collect() -> None:
            try:
                async for output in outputs:
                    state.take(output)
                    texts.append(output.delta_text)
            finally:
                outputs.close()

        async def disconnected() -> None:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    return

        work = asyncio.ensure_future(collect())
        watch = asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():
                state.cancelled = True
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                    await work
        headers = {"x-edgeqa-tier": "generated", "x-request-id": self.request_id}
        try:
            if state.cancelled:
                return Response(status_code=499)
            error = work.exception()
            if isinstance(error, TimeoutError):
                state.timed_out = True
                return APIError(504, "the request timed out", None, "timeout", "timeout").response()
            if error is not None:
                raise error
            if state.error is not None:
                return APIError(500, "generation failed", None, "server_error").response()
            state.first_sent = time.monotonic()
            body = self.shaper.whole(
                "".join(texts), _finish_reason(state.finish_reason), len(prompt_ids),
                state.completion_tokens,
            )  # fmt: skip
            return JSONResponse(body, headers=headers)
        finally:
            self.finish(state, prompt_ids, streamed=False)

    def finish(self, state: _Outcome, prompt_ids: list[int], streamed: bool) -> None:
        """Metrics, the online cache and the log row, once per admitted request."""
        if self._finished:
            return
        self._finished = True
        self.server.release_user(self.user)
        m, name = self.metrics, self.server.model_name
        times = state.times
        status = 200
        if state.cancelled:
            self.metrics.cancelled.labels("client").inc()
            status = 499
        elif state.timed_out:
            self.metrics.cancelled.labels("timeout").inc()
            status = 504
        elif state.error is not None:
            status = 500
        tier = "generated" if status in (200, 499, 504) else "error"
        m.requests.labels(tier, str(status)).inc()
        ttft_ms = None
        if times is not None and times.first_token is not None:
            ttft = times.first_token - times.arrival
            ttft_ms = ttft * 1000
            m.ttft.labels(name).observe(ttft)
            m.tier_ttft.labels("generated").observe(ttft)
            if times.queue_s is not None and times.ttft_compute_s is not None:
                m.queue.labels(name).observe(times.queue_s)
                m.ttft_queue.labels(name).observe(times.queue_s)
                m.ttft_compute.labels(name).observe(times.ttft_compute_s)
            if streamed and state.first_sent is not None:
                m.ttft_network.labels(name).observe(max(0.0, state.first_sent - times.first_token))
        if status == 200 and times is not None and times.finished is not None:
            e2e = times.finished - times.arrival
            m.e2e.labels(name).observe(e2e)
            m.success.labels(name, state.finish_reason or "unknown").inc()
            m.prompt_tokens.labels(name).observe(len(prompt_ids))
            m.generation_tokens.labels(name).observe(state.completion_tokens)
            if len(times.tokens) > 1:
                m.tpot.labels(name).observe(
                    (times.tokens[-1] - times.tokens[0]) / (len(times.tokens) - 1)
                )
            self.server._service_s = 0.9 * self.server._service_s + 0.1 * e2e
            if self.cache_key is not None and state.finish_reason == "stop":
                self.server.cache.put(self.cache_key, state.text, state.completion_tokens)
        self.server.write_log(
            **self.row, tier=tier, status=status, latency_ms=_ms(self.arrival), ttft_ms=ttft_ms
        )


class _ClosingStream(StreamingResponse):
    """A streaming response that runs ``on_close`` however it ends, even if the body iterator
    never started (a client gone before the first byte)."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None], **kw: Any):
        super().__init__(content, **kw)
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


class _Outcome:
    """What the engine said about one request so far."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.finish_reason: str | None = None
        self.completion_tokens = 0
        self.error: str | None = None
        self.times: Any = None
        self.first_sent: float | None = None
        self.chunks = 0
        self.cancelled = False
        self.timed_out = False

    def take(self, output: RequestOutput) -> None:
        self.parts.append(output.delta_text)
        self.times = output.times
        self.completion_tokens = output.completion_tokens
        if output.finished:
            self.finish_reason = output.finish_reason
            self.error = output.error

    @property
    def text(self) -> str:
        return "".join(self.parts)


def _pieces(text: str, size: int = 24) -> list[str]:
    """A stored answer in word-aligned pieces, so clients render it as they render a stream."""
    pieces, start = [], 0
    while start < len(text):
        end = min(len(text), start + size)
        space = text.rfind(" ", start + 1, end) if end < len(text) else -1
        end = space if space > start else end
        pieces.append(text[start:end])
        start = end
    return pieces or [""]


# -- running it -----------------------------------------------------------------------------------


def served_model_name(config: ServerConfig, model_spec: str) -> str:
    if config.served_model_name:
        return config.served_model_name
    if model_spec == "embedded":
        return "SmolLM2-135M-Instruct"
    return model_spec.rstrip("/").rsplit("/", 1)[-1] if "/" in model_spec else model_spec


def load_runtime(config: ServerConfig, store_uri: str | None = None) -> Runtime:
    """The engine from ``EDGEQA_*`` (origin/config.py), and the release poller for the tiers."""
    from edge_index.service import EdgeState
    from edge_index.store import open_store
    from origin.config import OriginConfig
    from origin.engine import Engine

    settings = OriginConfig.from_env()
    engine = Engine.from_env().start()
    releases = None
    if config.tiers:
        from edge_index.embedder import load_embedder

        store = open_store(store_uri or config.store_uri)
        releases = EdgeState(
            store, config.profile or None, load_embedder(config.embedder), config.poll_s
        )
    return Runtime(engine, settings.max_tokens, settings.temperature, releases)


def serve(
    config: ServerConfig,
    host: str,
    port: int,
    store_uri: str | None = None,
) -> None:
    import faiss
    import uvicorn

    from edge_index.store import open_store
    from origin.config import OriginConfig

    faiss.omp_set_num_threads(1)
    model = OriginConfig.from_env().model
    logs = None
    if config.log_requests:
        logs = LogWriter(open_store(store_uri or config.store_uri), source="origin")
    server = OriginServer(
        config, lambda: load_runtime(config, store_uri), served_model_name(config, model), logs
    )
    app = create_app(server)
    uvicorn.run(
        app, host=host, port=port, log_level="warning",
        timeout_graceful_shutdown=math.ceil(config.shutdown_grace_s) or None,
    )  # fmt: skip

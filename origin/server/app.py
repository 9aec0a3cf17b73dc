"""The origin's ASGI app: routes, CORS, the lifespan (loading, draining), and ``serve``."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from types import FrameType

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from origin.config import OriginSettings
from origin.server import info
from origin.server.completions import create_completion
from origin.server.protocol import APIError
from origin.server.state import OriginServer

Handler = Callable[[Request], Awaitable[Response]]


def create_app(server: OriginServer) -> Starlette:
    def bound(handler: Callable[[OriginServer, Request], Awaitable[Response]]) -> Handler:
        async def endpoint(request: Request) -> Response:
            return await handler(server, request)

        return endpoint

    async def chat(request: Request) -> Response:
        return await create_completion(server, request, "chat")

    async def completion(request: Request) -> Response:
        return await create_completion(server, request, "completion")

    async def not_found(request: Request, exc: Exception) -> Response:
        return APIError(404, f"no route {request.url.path}", "path").response()

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return APIError(405, f"{request.method} is not allowed here", "method").response()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        server.start_loading()  # /health says "loading" until the engine is up
        yield
        # ``DrainingServer`` has drained the requests in flight before uvicorn got here; what is
        # left (an app run by another server) is cancelled with the engine; the logs are flushed
        server.draining = True
        await run_in_threadpool(server.shutdown)

    return Starlette(
        lifespan=lifespan,
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completion, methods=["POST"]),
            Route("/v1/models", bound(info.models), methods=["GET"]),
            Route("/health", bound(info.health), methods=["GET"]),
            Route("/metrics", bound(info.metrics), methods=["GET"]),
            Route("/config.json", bound(info.web_config), methods=["GET"]),
            Route("/", bound(info.page), methods=["GET"]),
            Mount(
                "/web",
                StaticFiles(directory=server.settings.web_dir, check_dir=False),
                name="web",
            ),
        ],
        middleware=[cors_middleware()],
        exception_handlers={404: not_found, 405: method_not_allowed},
    )


def cors_middleware() -> Middleware:
    """Browsers on any site may call the API (keys, not origins, guard it). The tier is not
    exposed to them: with the timing, it would tell a page that someone asked recently."""
    return Middleware(
        CORSMiddleware,
        allow_origins=["*"],
        allow_methods=["GET", "POST"],
        allow_headers=["*"],
        expose_headers=["x-request-id", "retry-after"],
        max_age=600,
    )


class DrainingServer(uvicorn.Server):
    """uvicorn that drains before it stops.

    The first SIGTERM (or SIGINT) stops admission while the socket stays open — new requests get
    503 and ``/health`` says "draining", so a load balancer moves on — and gives the requests in
    flight ``EDGEQA_SHUTDOWN_GRACE_S`` to finish; streams still open then end with a final SSE
    error event (``code: shutting_down``) and ``[DONE]``, never a cut chunked body. Then uvicorn
    stops as usual (and the app flushes the logs). A second signal stops at once."""

    def __init__(self, config: uvicorn.Config, origin: OriginServer) -> None:
        super().__init__(config)
        self.origin = origin
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Future[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is None or self.origin.draining:
            super().handle_exit(sig, frame)  # before serving, or a second signal: stop now
            return
        self.origin.draining = True  # refuse from now on, even before the drain task runs
        self._loop.call_soon_threadsafe(self._start_drain, sig)

    def _start_drain(self, sig: int) -> None:
        async def drain() -> None:
            try:
                await self.origin.drain(self.origin.settings.shutdown_grace_s)
            finally:
                super(DrainingServer, self).handle_exit(sig, None)

        self._draining = asyncio.ensure_future(drain())


def serve(settings: OriginSettings, host: str, port: int) -> None:
    """Run the origin: the engine and release watcher from ``settings``, under uvicorn."""
    import faiss

    from base.logs import open_log_writer
    from base.store import open_store
    from origin.runtime import load_runtime

    faiss.omp_set_num_threads(1)
    store = open_store(settings.store)
    logs = open_log_writer(store, "origin", settings) if settings.log_requests else None
    server = OriginServer(settings, lambda: load_runtime(settings), logs)
    # the drain has ended every response; uvicorn's own wait only closes idle connections
    config = uvicorn.Config(
        create_app(server),
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=5,
        proxy_headers=False,  # the viewer: EDGEQA_TRUSTED_PROXIES (base/users.py)
    )
    DrainingServer(config, server).run()

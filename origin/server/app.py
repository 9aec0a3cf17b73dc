"""The origin's ASGI app: routes, CORS, the lifespan (loading, draining), and ``serve``."""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable

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
        # uvicorn has waited (timeout_graceful_shutdown) for requests in flight; what is left
        # is cancelled with the engine, and the logs are flushed
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
    """Browsers on any site may call the API (keys, not origins, guard it) and read the tier."""
    return Middleware(
        CORSMiddleware,
        allow_origins=["*"],
        allow_methods=["GET", "POST"],
        allow_headers=["*"],
        expose_headers=["x-edgeqa-tier", "x-request-id", "retry-after"],
        max_age=600,
    )


def serve(settings: OriginSettings, host: str, port: int) -> None:
    """Run the origin: the engine and release watcher from ``settings``, under uvicorn."""
    import faiss
    import uvicorn

    from edge_index.logs import LogWriter
    from edge_index.store import open_store
    from origin.runtime import load_runtime

    faiss.omp_set_num_threads(1)
    logs = LogWriter(open_store(settings.store), source="origin") if settings.log_requests else None
    server = OriginServer(settings, lambda: load_runtime(settings), logs)
    uvicorn.run(
        create_app(server),
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s) or None,
    )

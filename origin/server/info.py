"""The small endpoints: ``/v1/models``, ``/health``, ``/metrics`` (behind ``EDGEQA_METRICS_TOKEN``
when set), and the web client's page and ``/config.json`` (where it finds the CDN, the edge and
the release profile)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

from origin.server.auth import check_api_key, check_metrics_token
from origin.server.protocol import APIError
from origin.server.state import OriginServer


async def models(server: OriginServer, request: Request) -> Response:
    try:
        check_api_key(request, server.settings.api_keys)
    except APIError as error:
        return error.response()
    card: dict[str, Any] = {
        "id": server.model_name,
        "object": "model",
        "created": server.created,
        "owned_by": "edgeqa",
    }
    if server.runtime is not None:
        card["max_model_len"] = server.runtime.max_model_len
    return JSONResponse({"object": "list", "data": [card]})


async def health(server: OriginServer, request: Request) -> Response:
    status, body = server.health()
    return JSONResponse(body, status_code=status)


async def metrics(server: OriginServer, request: Request) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    try:
        check_metrics_token(request, server.settings.metrics_token)
    except APIError as error:
        return error.response()
    runtime = server.runtime
    if runtime is not None and runtime.releases is not None:
        runtime.releases.observe_age()
    return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def web_config(server: OriginServer, request: Request) -> Response:
    settings = server.settings
    return JSONResponse(
        {
            "cdn": settings.cdn_url,
            "edge": settings.edge_url,
            # a question's profile is its language's (base/languages.py: CJK -> zh)
            "profiles": {
                language: profile
                for language, profile in server.served_profiles().items()
                if profile
            },
            "model": server.model_name,
            # answer objects from the CDN are shown only when they prove themselves against a
            # release signed by one of these (docs/security.md#signing)
            "releasePublicKeys": list(settings.public_keys),
        },
        headers={"cache-control": "no-store"},
    )


async def page(server: OriginServer, request: Request) -> Response:
    index = server.settings.web_dir / "index.html"
    if not index.is_file():
        return APIError(404, "the web client is not installed here", "path").response()
    return FileResponse(index, headers={"cache-control": "no-cache"})

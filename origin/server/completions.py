"""``POST /v1/chat/completions`` and ``POST /v1/completions``: the request flow, top to bottom.

check the key -> the runtime must be ready -> read and parse the body (and the missed-hint
header) -> the model must be ours -> the asker's and its network's shares: hold a place in them or
refuse (429) -> the prompt's length in characters -> the prompt (a place in the tokenizer's
bounded queue, or 429) -> (a single question) look it up in the tiers, past
the release the client has just missed in, and send a hit -> admit it to the engine or
refuse it (429) -> stream it or answer it whole. Every request is counted and logged, refused ones
included, and a refusal is charged to its asker's share.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from origin.server import tiers
from origin.server.auth import check_api_key
from origin.server.generation import Generation
from origin.server.protocol import (
    APIError,
    ParsedRequest,
    parse_chat,
    parse_completion,
    parse_json,
    parse_missed_header,
)
from origin.server.responses import Answer, Shaper, answer_response
from origin.server.state import OriginServer

if TYPE_CHECKING:
    from base.users import Asker
    from edge_index.lookup import ReleaseIndex

log = logging.getLogger(__name__)

# a refused request's reason in the rejected-requests metric, by HTTP status
REFUSAL_REASONS = {401: "unauthorized", 413: "too_large", 503: "not_ready"}


async def create_completion(server: OriginServer, request: Request, kind: str) -> Response:
    arrival = time.monotonic()
    request_id = uuid.uuid4().hex[:24]
    settings = server.settings
    row: dict[str, Any] = {
        "request_id": request_id,
        "turns": 1,
        "query": "",
        "tenant": server.users.tenant(request),  # hashed, as the user is
    }
    parsed: ParsedRequest | None = None
    key_id: str | None = None
    asker: Asker | None = None
    try:
        key_id = check_api_key(request, settings.api_keys)
        runtime = server.ready_runtime()
        body = await read_body(request, settings.max_body_bytes)
        parse = parse_chat if kind == "chat" else parse_completion
        parsed = parse(
            body,
            runtime.max_model_len,
            runtime.default_max_tokens,
            runtime.default_temperature,
        )
        row.update(turns=parsed.turns, query=parsed.question[:4096])
        missed = parse_missed_header(request.headers)
        check_model(parsed, server.model_name)
        asker = server.users.of_request(request, parsed.user, key_id)
        # from here until its response is over the request counts in its asker's and its
        # network's shares: one already holding its share is refused before its prompt waits
        # for the tokenizer
        server.admission.hold(settings, runtime.engine, asker.user, asker.network)
    except ClientDisconnect:
        return Response(status_code=499)
    except APIError as error:
        if asker is None:
            asker = server.users.of_request(request, parsed.user if parsed else None, key_id)
        row.update(asker.log_fields())
        reason = error.code if error.status == 429 else None
        reason = reason or REFUSAL_REASONS.get(error.status, "invalid")
        return refuse(server, error, reason, row, arrival)

    row.update(asker.log_fields())
    user = asker.user
    admitted = False  # once admitted, the generation releases the hold when its response ends
    try:
        try:
            prompt = await server.tokenizing.prompt(runtime.engine, parsed, settings)
        except APIError as error:
            reason = error.code if error.status == 429 else None
            reason = reason or REFUSAL_REASONS.get(error.status, "invalid")
            return refuse(server, error, reason, row, arrival)

        shaper = Shaper(kind, request_id, server.model_name, int(time.time()))
        cacheable = (
            tiers.cache_key(parsed, settings.system_prompt) if settings.origin_tiers else None
        )
        skip_release = None
        if cacheable is not None:
            normalized, key = cacheable
            watcher = server.release_for(parsed.question)  # routed once, for the log row too
            profile = watcher.profile if watcher else None
            row.update(normalized=normalized, key=key, profile=profile or "")
            # one release for the whole lookup, even if a swap happens now
            index = watcher.index if watcher else None
            skip_release = tiers.skips_release(missed, profile, index)
            if skip_release is not None:
                server.metrics.observe_missed_hint(skip_release)
            scoped = tiers.scoped_key(key, key_id, row["tenant"])
            answer = await look_up(
                server,
                index,
                parsed,
                normalized,
                key,
                scoped,
                asker,
                prompt.params.max_tokens,
                release=not skip_release,
            )
            if answer is not None:
                server.metrics.observe_hit(answer.tier, time.monotonic() - arrival)
                elapsed_ms = (time.monotonic() - arrival) * 1000
                server.write_log(
                    **row, tier=answer.tier, status=200, latency_ms=elapsed_ms, ttft_ms=elapsed_ms
                )
                headers = {"x-edgeqa-tier": answer.tier, "x-request-id": request_id}
                return answer_response(
                    answer, shaper, parsed.stream, parsed.include_usage, len(prompt.ids), headers
                )

        cache_key = tiers.scoped_key(cacheable[1], key_id, row["tenant"]) if cacheable else None
        # KV prefixes are shared within the caller's tenant only, unless told otherwise: a sooner
        # first token would tell the caller that another tenant sent a prompt beginning like its
        # own
        global_prefixes = settings.prefix_caching_scope == "global"
        scope = "" if global_prefixes else tiers.tenant_scope(key_id, row["tenant"])
        generation = Generation(
            server,
            runtime,
            parsed,
            prompt,
            shaper,
            asker,
            arrival,
            row,
            cache_key,
            scope,
            checked=not skip_release,
        )
        try:
            server.check_admitting()  # a shutdown may have begun while the tiers were looked up
            outputs = server.admission.admit(
                settings,
                runtime.engine,
                user,
                len(prompt.ids),
                generation.open,
                prompt.params.max_tokens,
            )
        except APIError as error:
            reason = "not_ready" if error.status == 503 else error.code or "queue_full"
            return refuse(server, error, reason, row, arrival)
        admitted = True
    finally:
        if not admitted:
            server.admission.release(user, asker.network)
    if parsed.stream:
        return generation.streaming_response(outputs)
    return await generation.whole_response(request, outputs)


async def read_body(request: Request, limit: int) -> dict[str, Any]:
    """The JSON body; 413 past ``limit`` bytes, declared or not."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"the body exceeds {limit} bytes", "body", code="body_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"the body exceeds {limit} bytes", "body", code="body_too_large")
        chunks.append(chunk)
    return parse_json(b"".join(chunks))


def check_model(parsed: ParsedRequest, served: str) -> None:
    if parsed.model is not None and parsed.model != served:
        raise APIError(
            404,
            f"the model {parsed.model!r} does not exist; this origin serves {served!r}",
            "model",
            "invalid_request_error",
            "model_not_found",
        )


async def look_up(
    server: OriginServer,
    index: ReleaseIndex | None,
    parsed: ParsedRequest,
    normalized: str,
    key: str,
    cache_key: str,
    asker: Asker,
    max_tokens: int,
    release: bool = True,
) -> Answer | None:
    """The tiers' answer, or None: a broken release or cache must not fail the request.
    ``release=False``: the client has just missed in ``index``'s release at the edge."""
    runtime = server.runtime
    if runtime is None:
        return None
    try:
        looked = await tiers.lookup(
            index,
            server.cache,
            runtime.tokenizer,
            parsed,
            normalized,
            key,
            max_tokens,
            cache_key,
            asker.user,
            release,
            asker.network,
        )
    except Exception:
        log.exception("origin tier lookup failed; generating")
        return None
    if looked.semantic is not None:
        server.metrics.observe_semantic(looked.semantic)
    return looked.answer


def refuse(
    server: OriginServer, error: APIError, reason: str, row: dict[str, Any], arrival: float
) -> Response:
    """The refusal's response, counted and logged; an asker's doing (a 4xx) is charged to it."""
    if 400 <= error.status < 500:
        server.admission.charge_refusal(server.settings, row["user"])
    server.metrics.observe_rejected(error.status, reason)
    latency_ms = (time.monotonic() - arrival) * 1000
    server.write_log(**row, tier="rejected", status=error.status, latency_ms=latency_ms)
    return error.response()

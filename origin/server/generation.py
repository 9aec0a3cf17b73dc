"""One admitted request on the engine: sent as it is generated (SSE) or whole, then accounted for
once — metrics, the online cache, the request-log row, the user's admission slot — however it
ended (finished, failed, timed out, its client gone, or cut off by a shutdown past its grace).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from origin.engine.stream import open_stream
from origin.server.protocol import APIError, ParsedRequest
from origin.server.responses import (
    DONE,
    SSE_HEADERS,
    ClosingStream,
    Shaper,
    error_event,
    finish_reason,
)
from policy.answers import uncacheable

if TYPE_CHECKING:
    from base.users import Asker
    from origin.engine import OutputStream, RequestOutput
    from origin.engine.request import RequestTimes
    from origin.runtime import Runtime
    from origin.server.prompts import Prompt
    from origin.server.state import OriginServer


class Outcome:
    """What the engine said about one request so far, and how the response went."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.finish_reason: str | None = None
        self.completion_tokens = 0
        self.error: str | None = None
        self.times: RequestTimes | None = None
        self.first_sent: float | None = None  # the first bytes handed to the socket
        self.chunks = 0
        self.cancelled = False
        self.timed_out = False
        self.interrupted = False  # cut off by a shutdown

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

    @property
    def status(self) -> int:
        if self.cancelled:
            return 499
        if self.timed_out:
            return 504
        if self.interrupted:
            return 503
        return 500 if self.error is not None else 200


def _ms(since: float) -> float:
    return (time.monotonic() - since) * 1000


class ShuttingDown(Exception):
    """A request still generating when the origin's shutdown grace ran out."""


SHUTDOWN_MESSAGE = "the origin shut down before the answer was complete; retry"


class Generation:
    def __init__(
        self,
        server: OriginServer,
        runtime: Runtime,
        parsed: ParsedRequest,
        prompt: Prompt,
        shaper: Shaper,
        asker: Asker,
        arrival: float,
        row: dict[str, Any],
        cache_key: str | None,
        prefix_scope: str = "",
        checked: bool = True,
    ) -> None:
        self.server = server
        self.runtime = runtime
        self.parsed = parsed
        self.prompt = prompt
        self.shaper = shaper
        self.user = asker.user
        self.network = asker.network  # what ``finish`` releases, and counts in the cache's k
        self.arrival = arrival
        self.row = row
        self.cache_key = cache_key  # where a complete answer goes in the online cache
        # the release's semantic tier was searched before generating (False: a client's hint
        # skipped it): an unchecked answer yields to that tier for callers without one (cache.py)
        self.checked = checked
        self.prefix_scope = prefix_scope  # whose KV prefixes the request may start from
        self.outcome = Outcome()
        self.outputs: OutputStream | None = None
        self._finished = False

    @property
    def headers(self) -> dict[str, str]:
        return {"x-edgeqa-tier": "generated", "x-request-id": self.row["request_id"]}

    def open(self) -> OutputStream:
        """Queue the request in the engine, within the request timeout (counted from arrival)."""
        timeout = self.server.settings.request_timeout_s - (time.monotonic() - self.arrival)
        self.outputs = open_stream(
            self.runtime.engine,
            self.prompt.ids,
            self.prompt.params,
            self.row["request_id"],
            self.arrival,
            max(0.0, timeout),
            self.prefix_scope,
        )
        self.server.in_flight.add(self)
        return self.outputs

    def interrupt(self) -> None:
        """End the response now with a final error (a stream: an error event and ``[DONE]``)."""
        if self.outputs is not None:
            self.outputs.interrupt(ShuttingDown())

    # -- streaming --------------------------------------------------------------------------------

    def streaming_response(self, outputs: OutputStream) -> Response:
        def abandon() -> None:
            # the response is over (sent, failed, or never started): cancel what is left
            if not self._finished:
                outputs.close()
                self.outcome.cancelled = self.outcome.finish_reason is None
                self.finish(streamed=True)

        return ClosingStream(
            self._events(outputs),
            abandon,
            media_type="text/event-stream",
            headers={**SSE_HEADERS, **self.headers},
        )

    async def _events(self, outputs: OutputStream) -> AsyncIterator[bytes]:
        shaper, chat, state = self.shaper, self.parsed.kind == "chat", self.outcome
        try:
            async for output in outputs:
                state.take(output)
                if output.error is not None:
                    yield error_event("generation failed", "server_error")
                    break
                if output.delta_text or (state.first_sent is None and output.finished):
                    yield shaper.chunk(output.delta_text, None, role=chat and not state.chunks)
                    state.chunks += 1
                    if state.first_sent is None:
                        state.first_sent = time.monotonic()  # resumed: the bytes were sent
                if output.finished:
                    yield shaper.chunk("", finish_reason(output.finish_reason))
                    if self.parsed.include_usage:
                        yield shaper.usage_chunk(len(self.prompt.ids), output.completion_tokens)
                    yield DONE
        except TimeoutError:
            state.timed_out = True
            yield error_event("the request timed out", "timeout", "timeout")
            yield DONE
        except ShuttingDown:
            state.interrupted = True
            yield error_event(SHUTDOWN_MESSAGE, "service_unavailable", "shutting_down")
            yield DONE
        except asyncio.CancelledError:
            state.cancelled = True
            raise
        finally:
            outputs.close()
            self.finish(streamed=True)

    # -- whole ------------------------------------------------------------------------------------

    async def whole_response(self, request: Request, outputs: OutputStream) -> Response:
        """Collect the answer, watching for the client to go away (which cancels it)."""
        state = self.outcome

        async def collect() -> None:
            try:
                async for output in outputs:
                    state.take(output)
            finally:
                outputs.close()

        async def disconnected() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        work = asyncio.ensure_future(collect())
        watch = asyncio.ensure_future(disconnected())
        try:
            try:
                await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                watch.cancel()
                if not work.done():
                    state.cancelled = True
                    work.cancel()
                    with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                        await work
            if state.cancelled:
                return Response(status_code=499)
            error = work.exception()
            if isinstance(error, TimeoutError):
                state.timed_out = True
                return APIError(504, "the request timed out", None, "timeout", "timeout").response()
            if isinstance(error, ShuttingDown):
                state.interrupted = True
                return APIError(
                    503,
                    SHUTDOWN_MESSAGE,
                    None,
                    "service_unavailable",
                    "shutting_down",
                    headers={"retry-after": "1"},
                ).response()
            if error is not None:
                raise error
            if state.error is not None:
                return APIError(500, "generation failed", None, "server_error").response()
            body = self.shaper.whole(
                state.text,
                finish_reason(state.finish_reason),
                len(self.prompt.ids),
                state.completion_tokens,
            )
            return JSONResponse(body, headers=self.headers)
        finally:
            self.finish(streamed=False)

    def _cache(self, cache_key: str, state: Outcome) -> None:
        """Write a complete answer to the online cache, unless it must never be stored: a
        time-sensitive question's, or a degenerate answer (each counted by reason)."""
        reason = uncacheable(
            self.parsed.question,
            state.text,
            state.finish_reason,
            self.server.settings.allow_answer_links,
        )
        if reason is not None:
            self.server.metrics.observe_cache_skipped(reason)
        elif state.finish_reason == "stop":
            self.server.cache.put(
                cache_key,
                state.text,
                state.completion_tokens,
                self.user,
                self.checked,
                self.network,
            )

    # -- accounting -------------------------------------------------------------------------------

    def finish(self, streamed: bool) -> None:
        """Metrics, the online cache and the log row, once per admitted request."""
        if self._finished:
            return
        self._finished = True
        server, state = self.server, self.outcome
        server.in_flight.discard(self)
        server.admission.release(self.user, self.network)
        status, times = state.status, state.times
        server.metrics.observe_generated(
            status,
            times,
            state.finish_reason,
            len(self.prompt.ids),
            state.completion_tokens,
            state.first_sent if streamed else None,
        )
        if status == 200 and times is not None and times.finished is not None:
            server.admission.observe_service(times.finished - times.arrival)
            if self.cache_key is not None:
                self._cache(self.cache_key, state)
        ttft_ms = None
        if times is not None and times.first_token is not None:
            ttft_ms = (times.first_token - times.arrival) * 1000
        server.write_log(
            **self.row,
            tier="generated" if status != 500 else "error",
            status=status,
            latency_ms=_ms(self.arrival),
            ttft_ms=ttft_ms,
        )

"""Response shaping: the OpenAI JSON of one request, whole or as server-sent events.

``Shaper`` makes the bodies (``chat.completion`` / ``text_completion`` and their ``.chunk``
events); ``answer_response`` sends an answer that is already known (a release or online-cache
hit) in the same shape a generated one would have, streamed in word-aligned pieces.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

SSE_HEADERS = {"cache-control": "no-store", "x-accel-buffering": "no"}
DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class Answer:
    """A cache or release hit, fitted to the request (cut at its ``max_tokens``)."""

    tier: str
    text: str
    completion_tokens: int
    finish_reason: str


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


def error_event(message: str, type_: str, code: str | None = None) -> bytes:
    return sse({"error": {"message": message, "type": type_, "param": None, "code": code}})


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def finish_reason(reason: str | None) -> str | None:
    """The engine's reasons in OpenAI's words (``abort`` and ``error`` never reach a client)."""
    return reason if reason in ("stop", "length") else None


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
        return sse({**self._head(True), "choices": [choice]})

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        return sse(
            {**self._head(True), "choices": [], "usage": usage(prompt_tokens, completion_tokens)}
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
            "usage": usage(prompt_tokens, completion_tokens),
        }


def pieces(text: str, size: int = 24) -> list[str]:
    """A stored answer in word-aligned pieces, so clients render it as they render a stream."""
    out, start = [], 0
    while start < len(text):
        end = min(len(text), start + size)
        space = text.rfind(" ", start + 1, end) if end < len(text) else -1
        end = space if space > start else end
        out.append(text[start:end])
        start = end
    return out or [""]


def answer_response(
    answer: Answer,
    shaper: Shaper,
    stream: bool,
    include_usage: bool,
    prompt_tokens: int,
    headers: dict[str, str],
) -> Response:
    """A known answer, whole or streamed like a generated one."""
    if not stream:
        body = shaper.whole(
            answer.text, answer.finish_reason, prompt_tokens, answer.completion_tokens
        )
        return JSONResponse(body, headers=headers)

    async def events() -> AsyncIterator[bytes]:
        chat = shaper.kind == "chat"
        for i, piece in enumerate(pieces(answer.text)):
            yield shaper.chunk(piece, None, role=chat and i == 0)
        yield shaper.chunk("", answer.finish_reason)
        if include_usage:
            yield shaper.usage_chunk(prompt_tokens, answer.completion_tokens)
        yield DONE

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={**SSE_HEADERS, **headers}
    )


class ClosingStream(StreamingResponse):
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

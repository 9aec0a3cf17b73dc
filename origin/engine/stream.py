"""The async front end: one request's outputs as an async iterator, for the HTTP server.

It owns the prompt's tokens (``origin.chat.prompt_ids``: a question or chat messages in the
model's chat template, or token ids as they are) and hands the core token ids.
``open_stream`` queues the request at once (so the server admits and queues in one step) and
returns an ``OutputStream``: outputs reach it from the engine thread through an asyncio queue.
``close()`` cancels the request, and past its deadline the iterator cancels it and raises
``TimeoutError``; ``interrupt(error)`` ends it early with ``error`` (a server shutting down).
"""

from __future__ import annotations

import asyncio

from origin.chat import Prompt, prompt_ids
from origin.engine.core import Engine
from origin.engine.request import RequestOutput
from origin.sampling import SamplingParams


def open_stream(
    engine: Engine,
    prompt: Prompt,
    params: SamplingParams | None = None,
    request_id: str | None = None,
    arrival: float | None = None,
    timeout_s: float | None = None,
    prefix_scope: str = "",
) -> OutputStream:
    """Queue a request on ``engine`` (starting its loop) and return its outputs as an async
    iterator; call from a running event loop. ``close()`` it, or use it as ``async with``, to
    cancel the request when leaving early. ``timeout_s`` bounds the whole request, from now:
    past it the request is cancelled and the iterator raises ``TimeoutError``.
    ``prefix_scope``: as ``Engine.add_request``'s."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

    def deliver(output: RequestOutput) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, output)
        except RuntimeError:
            pass  # the consumer's event loop is gone; the request is being cancelled

    ids = prompt_ids(engine.tokenizer, prompt)
    request = engine.add_request(ids, params, deliver, request_id, arrival, prefix_scope)
    engine.start()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    return OutputStream(engine, request.request_id, queue, deadline)


class OutputStream:
    """The outputs of one request, as an async iterator (``open_stream``)."""

    def __init__(
        self,
        engine: Engine,
        request_id: str,
        queue: asyncio.Queue[RequestOutput | BaseException],
        deadline: float | None,
    ) -> None:
        self.engine = engine
        self.request_id = request_id
        self.queue = queue
        self.deadline = deadline
        self.finished = False
        self.error: BaseException | None = None  # set by ``interrupt``

    def __aiter__(self) -> OutputStream:
        return self

    async def __aenter__(self) -> OutputStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()  # leaving the block early cancels the request

    async def __anext__(self) -> RequestOutput:
        if self.error is not None:
            raise self.error
        if self.finished:
            raise StopAsyncIteration
        if self.deadline is None:
            output = await self.queue.get()
        else:
            remaining = self.deadline - asyncio.get_running_loop().time()
            try:
                output = await asyncio.wait_for(self.queue.get(), max(0.0, remaining))
            except TimeoutError:
                self.close()
                raise
        if isinstance(output, BaseException):  # ``interrupt``'s wake-up
            raise output
        self.finished = output.finished
        return output

    def interrupt(self, error: BaseException) -> None:
        """Cancel the request and end the iteration with ``error``, ahead of any outputs still
        queued; from the stream's own event loop (a server draining at shutdown)."""
        if self.error is None and not self.finished:
            self.error = error
            self.close()
            self.queue.put_nowait(error)  # wakes a consumer waiting on the queue

    def close(self) -> None:
        """Cancel the request unless it has finished (its slot is free at the next step)."""
        if not self.finished:
            self.finished = True
            self.engine.cancel(self.request_id)

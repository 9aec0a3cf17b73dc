"""A parsed request as the engine's prompt: token ids and the answer's room in the context.

Tokenizing costs about 0.5 s per MiB of text, and the server tokenizes one prompt at a time (a
fast tokenizer's settings are not safe to share between threads), so a prompt of more characters
than its context would take is refused before it waits for the tokenizer
(``check_prompt_chars``): ``MAX_CHARS_PER_TOKEN`` a token of ``max_model_len`` (or the
vocabulary's longest token, if shorter). Text runs 3 to 5 characters a token; only long runs of
one character (rules of dashes, indentation) take more, and a prompt made of them is refused
although it might fit. A short prompt is tokenized on the event loop when the tokenizer is free
(``try_build_prompt_inline``), anything else in a worker thread, so a long prompt never holds
the loop.

The prompts waiting for the tokenizer are a bounded queue (``TokenizeQueue``): past
``max_tokenize_queue`` of them a request is refused at once (429 ``tokenize_queue_full``), and one
that has waited ``max_tokenize_wait_s`` gives up (429 ``tokenize_timeout``), so no request waits
for the tokenizer without bound. The per-asker and per-network shares (``admission.py``) are
checked before: one network holds at most its share of the queue's places.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from anyio import CapacityLimiter, to_thread

from origin.chat import encode_chat
from origin.sampling import SamplingParams
from origin.server.protocol import APIError, ParsedRequest

if TYPE_CHECKING:
    from origin.config import OriginSettings
    from origin.engine import Engine


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    params: SamplingParams  # the request's, with max_tokens cut to the room left when implicit


_TOKENIZING = threading.Lock()
# a prompt this short tokenizes in well under a millisecond: on the event loop when the tokenizer
# is free, sparing a cached answer the thread hop (a few ms under load)
INLINE_PROMPT_CHARS = 4096
# characters a token of the context may stand for, on average, in a prompt that is tokenized:
# 16,384 characters for a 2,048-token context, about 8 ms of tokenizing
MAX_CHARS_PER_TOKEN = 8


@functools.lru_cache(maxsize=8)
def longest_token_chars(tokenizer: Any) -> int:
    """An upper bound on the characters one token covers (its byte-level spelling's length)."""
    return max((len(token) for token in tokenizer.get_vocab()), default=1)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def prompt_chars(parsed: ParsedRequest) -> int:
    return sum(
        len(s) for s in _strings(parsed.messages if parsed.kind == "chat" else parsed.prompt)
    )


def max_prompt_chars(engine: Engine) -> int:
    """The most characters a prompt may have to be tokenized."""
    per_token = min(MAX_CHARS_PER_TOKEN, longest_token_chars(engine.tokenizer))
    return engine.config.max_model_len * per_token


def check_prompt_chars(engine: Engine, parsed: ParsedRequest) -> None:
    """400 ``context_length_exceeded`` for a text longer than ``max_prompt_chars``, before it
    waits for the tokenizer."""
    field = "messages" if parsed.kind == "chat" else "prompt"
    chars = prompt_chars(parsed)
    limit = max_prompt_chars(engine)
    if chars > limit:
        raise APIError(
            400,
            f"the prompt has {chars} characters; a {engine.config.max_model_len}-token context "
            f"takes at most {limit}",
            field,
            code="context_length_exceeded",
        )


def try_build_prompt_inline(
    engine: Engine, parsed: ParsedRequest, system_prompt: str
) -> Prompt | None:
    """``build_prompt`` on the caller's thread for a short prompt when the tokenizer is free;
    None when the caller must use a worker thread."""
    if prompt_chars(parsed) > INLINE_PROMPT_CHARS or not _TOKENIZING.acquire(blocking=False):
        return None
    try:
        return build_prompt(engine, parsed, system_prompt, _locked=True)
    finally:
        _TOKENIZING.release()


def build_prompt(
    engine: Engine, parsed: ParsedRequest, system_prompt: str, _locked: bool = False
) -> Prompt:
    """The prompt's token ids (a chat without instructions gets ``system_prompt``, as the
    nightly job's answers do); 400 when it is too long, empty or leaves no room for an answer.
    Blocks for the tokenizer: call it from a worker thread."""
    check_prompt_chars(engine, parsed)
    if parsed.kind == "chat":
        messages = parsed.messages
        if system_prompt and not any(m["role"] == "system" for m in messages):
            messages = [{"role": "system", "content": system_prompt}, *messages]
        with contextlib.nullcontext() if _locked else _TOKENIZING:
            ids, field = encode_chat(engine.tokenizer, messages), "messages"
    elif isinstance(parsed.prompt, str):
        with contextlib.nullcontext() if _locked else _TOKENIZING:
            ids = engine.tokenizer.encode(parsed.prompt, add_special_tokens=False)
        field = "prompt"
    else:
        vocab = len(engine.tokenizer)
        if max(parsed.prompt) >= vocab:
            raise APIError(400, f"token ids must be below {vocab}", "prompt")
        ids, field = list(parsed.prompt), "prompt"
    if not ids:
        raise APIError(400, "the prompt encodes to no tokens", field)
    limit, room = engine.config.max_model_len, engine.config.room(len(ids))
    if room < 1:
        raise APIError(
            400,
            f"the prompt has {len(ids)} tokens; the context is {limit}",
            field,
            code="context_length_exceeded",
        )
    params = parsed.params
    if params.max_tokens > room:  # the engine's own check (Scheduler.check_fits), said in HTTP
        if parsed.max_tokens_given:
            name = "max_completion_tokens" if parsed.kind == "chat" else "max_tokens"
            raise APIError(
                400,
                f"prompt ({len(ids)} tokens) + {params.max_tokens} exceeds the context of "
                f"{limit} tokens",
                name,
                code="context_length_exceeded",
            )
        params = replace(params, max_tokens=room)
    return Prompt(ids, params)


class TokenizeQueue:
    """The prompts waiting for the tokenizer (one a process: ``_TOKENIZING``), a bounded queue.
    Each waits in a thread of its own (``_threads``, never contended: the bound is checked
    first), so waiting prompts never take the threads the semantic tier runs on."""

    def __init__(self) -> None:
        self.waiting = 0
        self._lock = threading.Lock()
        self._threads = CapacityLimiter(1)

    async def prompt(
        self, engine: Engine, parsed: ParsedRequest, settings: OriginSettings
    ) -> Prompt:
        """``build_prompt``: inline for a short prompt when the tokenizer is free, else waiting
        for it in a thread, within the queue's bound (past it 429 ``tokenize_queue_full`` at
        once) and its deadline (past it 429 ``tokenize_timeout``)."""
        check_prompt_chars(engine, parsed)  # before it waits for the tokenizer
        prompt = try_build_prompt_inline(engine, parsed, settings.system_prompt)
        if prompt is not None:
            return prompt
        bound, wait_s = settings.max_tokenize_queue, settings.max_tokenize_wait_s
        with self._lock:
            if self.waiting >= bound:
                raise _busy(f"{self.waiting} prompts wait for the tokenizer", "tokenize_queue_full")
            self.waiting += 1
            if self._threads.total_tokens < bound:
                self._threads.total_tokens = bound
        deadline = time.monotonic() + wait_s
        try:
            return await to_thread.run_sync(
                _build_by,
                engine,
                parsed,
                settings.system_prompt,
                deadline,
                limiter=self._threads,
            )
        finally:
            with self._lock:
                self.waiting -= 1


def _build_by(engine: Engine, parsed: ParsedRequest, system_prompt: str, deadline: float) -> Prompt:
    """``build_prompt`` once the tokenizer is free, if it is before ``deadline`` (monotonic);
    429 ``tokenize_timeout`` otherwise."""
    if not _TOKENIZING.acquire(timeout=max(0.0, deadline - time.monotonic())):
        raise _busy("the prompt waited too long for the tokenizer", "tokenize_timeout")
    try:
        return build_prompt(engine, parsed, system_prompt, _locked=True)
    finally:
        _TOKENIZING.release()


def _busy(message: str, code: str) -> APIError:
    """429 ``code``: the tokenizer is busier than the queue allows (it drains in well under a
    second at the default bound: ``MAX_CHARS_PER_TOKEN`` bounds each prompt's tokenizing)."""
    return APIError(
        429,
        f"the origin is at capacity ({code}: {message}); retry later",
        None,
        "rate_limit_exceeded",
        code,
        headers={"retry-after": "1"},
    )

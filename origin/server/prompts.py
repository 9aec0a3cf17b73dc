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
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from origin.sampling import SamplingParams
from origin.server.protocol import APIError, ParsedRequest

if TYPE_CHECKING:
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
            ids, field = engine.encode(messages), "messages"
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

"""A parsed request as the engine's prompt: token ids and the answer's room in the context."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from origin.sampling import SamplingParams
from origin.server.protocol import APIError, ParsedRequest

if TYPE_CHECKING:
    from origin.engine import Engine


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    params: SamplingParams  # the request's, with max_tokens cut to the room left when implicit


def build_prompt(engine: Engine, parsed: ParsedRequest, system_prompt: str) -> Prompt:
    """The prompt's token ids (a chat without instructions gets ``system_prompt``, as the
    nightly job's answers do); 400 when it is empty or leaves no room for an answer."""
    if parsed.kind == "chat":
        messages = parsed.messages
        if system_prompt and not any(m["role"] == "system" for m in messages):
            messages = [{"role": "system", "content": system_prompt}, *messages]
        ids, field = engine.encode(messages), "messages"
    elif isinstance(parsed.prompt, str):
        ids, field = engine.tokenizer.encode(parsed.prompt, add_special_tokens=False), "prompt"
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

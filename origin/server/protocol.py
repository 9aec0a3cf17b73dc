"""The OpenAI-compatible request bodies (and edgeqa's one request header): parsing, validation
and the error shape.

Every problem with a request becomes an ``APIError`` whose JSON body is OpenAI's
``{"error": {"message", "type", "param", "code"}}`` with ``param`` naming the offending field
(``messages[1].content``, ``temperature``...). What a request asks for is returned as a
``ParsedRequest`` that the server can hand to the engine; the fields OpenAI clients send but that
change nothing here (``best_of: 1``, ``logprobs: null``, ``n: 1``, zero penalties) are accepted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from base.bodies import BodyError, parse_body
from base.missed import MISSED_HEADER, Missed, parse_missed
from origin.chat import Message
from origin.sampling import SamplingParams

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP = 16


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        type_: str = "invalid_request_error",
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type_
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


@dataclass
class ParsedRequest:
    kind: str  # "chat" or "completion"
    model: str | None
    stream: bool
    include_usage: bool
    params: SamplingParams
    max_tokens_given: bool
    messages: list[Message] = field(default_factory=list)  # chat: roles and text only
    prompt: str | list[int] = ""  # completion: text or token ids
    user: str | None = None

    @property
    def turns(self) -> int:
        """User messages in the conversation (1 for a single question)."""
        if self.kind != "chat":
            return 1
        return sum(1 for m in self.messages if m["role"] == "user")

    @property
    def single_question(self) -> bool:
        """Instructions at most, then exactly one user message: what a cache may answer."""
        rest = [m for m in self.messages if m["role"] != "system"]
        return self.kind == "chat" and len(rest) == 1 and rest[0]["role"] == "user"

    @property
    def question(self) -> str:
        """The last user message (chat) or the prompt text (completion)."""
        if self.kind != "chat":
            return self.prompt if isinstance(self.prompt, str) else ""
        users = [m["content"] for m in self.messages if m["role"] == "user"]
        return users[-1] if users else ""

    @property
    def default_sampling(self) -> bool:
        """Greedy with nothing that changes the text: the only answers a cache may hold."""
        p = self.params
        return p.greedy and p.top_p == 1.0 and p.top_k == 0 and not p.stop and not p.ignore_eos


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; 400 naming ``body``, or the field whose value no field may
    take (an integer past 4300 digits, a lone surrogate: ``base/bodies.py``)."""
    try:
        body = parse_body(raw)
    except BodyError as error:
        raise APIError(400, str(error), error.field) from None
    if not isinstance(body, dict):
        raise APIError(400, "the body must be a JSON object", "body")
    return body


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise APIError(400, f"{name} must be a number", name)
    if not math.isfinite(value) or not low <= value <= high:
        raise APIError(400, f"{name} must be between {low} and {high}, got {value}", name)
    return float(value)


def _bool(body: dict[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise APIError(400, f"{name} must be true or false", name)
    return value


def _tolerated(body: dict[str, Any]) -> None:
    """Fields clients send with neutral values; anything else would be silently ignored."""
    for name, neutral in (("n", 1), ("best_of", 1)):
        value = body.get(name)
        if value is not None and (not _is_int(value) or value != neutral):
            raise APIError(400, f"only {name}={neutral} is supported", name)
    for name in ("presence_penalty", "frequency_penalty"):
        value = _number(body, name, -2.0, 2.0)
        if value not in (None, 0.0):
            raise APIError(400, f"{name} is not supported (only 0)", name)
    if body.get("logprobs") not in (None, False):
        raise APIError(400, "logprobs are not supported", "logprobs")
    if body.get("tools") or body.get("functions"):
        raise APIError(400, "tool calling is not supported", "tools")


def _sampling(
    body: dict[str, Any], max_model_len: int, default_max_tokens: int, default_temperature: float
) -> tuple[SamplingParams, bool]:
    max_tokens = None
    for name in ("max_tokens", "max_completion_tokens"):  # the newer name wins when both are set
        value = body.get(name)
        if value is None:
            continue
        if not _is_int(value):
            raise APIError(400, f"{name} must be an integer", name)
        if not 1 <= value <= max_model_len:
            raise APIError(400, f"{name} must be between 1 and {max_model_len}, got {value}", name)
        max_tokens = value
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise APIError(400, "top_p must be above 0", "top_p")
    top_k = body.get("top_k")
    if top_k is not None and (not _is_int(top_k) or top_k < -1):
        raise APIError(400, "top_k must be an integer >= -1 (-1 or 0: off)", "top_k")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise APIError(400, "seed must be an integer", "seed")
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,) if stop else ()
    elif isinstance(stop, list) and all(isinstance(s, str) and s for s in stop):
        if len(stop) > MAX_STOP:
            raise APIError(400, f"at most {MAX_STOP} stop strings", "stop")
        stops = tuple(stop)
    else:
        raise APIError(400, "stop must be a string or a list of non-empty strings", "stop")
    params = SamplingParams(
        max_tokens=max_tokens or default_max_tokens,
        temperature=default_temperature if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        top_k=max(0, top_k or 0),
        seed=seed,
        stop=stops,
        ignore_eos=_bool(body, "ignore_eos"),
    )
    return params, max_tokens is not None


def _stream_options(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise APIError(400, "stream_options must be an object", "stream_options")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise APIError(400, "include_usage must be true or false", "stream_options.include_usage")
    return stream, include


def _model_and_user(body: dict[str, Any]) -> tuple[str | None, str | None]:
    model, user = body.get("model"), body.get("user")
    if model is not None and not isinstance(model, str):
        raise APIError(400, "model must be a string", "model")
    if user is not None and not isinstance(user, str):
        raise APIError(400, "user must be a string", "user")
    return model, user


def _content(value: Any, where: str, role: str) -> str:
    """Message content: a string, or a list of text parts (joined)."""
    if isinstance(value, str):
        return value
    if value is None and role == "assistant":
        return ""
    if not isinstance(value, list) or not value:
        raise APIError(400, "content must be a string or a non-empty list of parts", where)
    texts = []
    for j, part in enumerate(value):
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise APIError(400, f"content part of type {kind!r} is not supported", f"{where}[{j}]")
        text = part.get("text")
        if not isinstance(text, str):
            raise APIError(400, "a text part needs a string 'text'", f"{where}[{j}].text")
        texts.append(text)
    return "\n".join(texts)


def parse_chat(
    body: dict[str, Any], max_model_len: int, default_max_tokens: int, default_temperature: float
) -> ParsedRequest:
    messages = body.get("messages")
    if messages is None:
        raise APIError(400, "messages is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "messages must be a non-empty list", "messages")
    parsed: list[Message] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise APIError(400, "each message must be an object", f"messages[{i}]")
        role = message.get("role")
        if role not in ROLES:
            raise APIError(400, f"role must be one of {', '.join(ROLES)}", f"messages[{i}].role")
        if "content" not in message:
            raise APIError(400, "content is required", f"messages[{i}].content")
        content = _content(message["content"], f"messages[{i}].content", role)
        parsed.append({"role": "system" if role == "developer" else role, "content": content})
    if not any(m["role"] == "user" for m in parsed):
        raise APIError(400, "messages must include a user message", "messages")
    return _request(
        "chat", body, max_model_len, default_max_tokens, default_temperature, messages=parsed
    )


def parse_completion(
    body: dict[str, Any], max_model_len: int, default_max_tokens: int, default_temperature: float
) -> ParsedRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        pass
    elif not isinstance(prompt, str) or not prompt:
        raise APIError(
            400, "prompt must be a non-empty string or token-id list (one prompt)", "prompt"
        )
    if body.get("echo") not in (None, False):
        raise APIError(400, "echo is not supported", "echo")
    if body.get("suffix") not in (None, ""):
        raise APIError(400, "suffix is not supported", "suffix")
    return _request(
        "completion", body, max_model_len, default_max_tokens, default_temperature, prompt=prompt
    )


def _request(
    kind: str,
    body: dict[str, Any],
    max_model_len: int,
    default_max_tokens: int,
    default_temperature: float,
    **what: Any,
) -> ParsedRequest:
    """The fields both endpoints share, around ``what`` (messages or prompt)."""
    _tolerated(body)
    stream, include_usage = _stream_options(body)
    params, given = _sampling(body, max_model_len, default_max_tokens, default_temperature)
    model, user = _model_and_user(body)
    return ParsedRequest(
        kind=kind,
        model=model,
        stream=stream,
        include_usage=include_usage,
        params=params,
        max_tokens_given=given,
        user=user,
        **what,
    )


def parse_missed_header(headers: Headers) -> Missed | None:
    """The ``x-edgeqa-missed`` header: the release a client has just missed in at the edge, or
    None. Malformed, or sent more than once: 400 naming it."""
    values = headers.getlist(MISSED_HEADER)
    if not values:
        return None
    if len(values) > 1:
        message = f"{MISSED_HEADER} was sent {len(values)} times; send it once"
        raise APIError(400, message, MISSED_HEADER)
    try:
        return parse_missed(values[0])
    except ValueError as error:
        raise APIError(400, str(error), MISSED_HEADER) from None

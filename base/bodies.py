"""Request bodies: the JSON a client POSTs, parsed, every value in it one the services can use.

Both services read JSON bodies (the edge's ``POST /v1/lookup``, the origin's OpenAI API). Two
kinds of value parse in Python yet would fail later, as a 500:

- an integer of more digits than ``sys.get_int_max_str_digits()`` (4300): ``json.loads`` raises
  a bare ``ValueError`` for the whole body (Python's guard against quadratic conversion);
- a lone surrogate (the escape ``"\\ud800"``, or its bytes): a ``str`` with no UTF-8 form, which
  hashing, tokenizing or writing it out cannot encode.

``parse_body`` refuses both with a ``BodyError`` naming the field (``max_tokens``,
``messages[0].content``), which each service answers with its 400.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from base.errors import EdgeQAError

# where a lone surrogate can come from: a \uD800-\uDFFF escape, those code points' bytes (json
# decodes bytes with "surrogatepass"), or a UTF-16/32 body (whose ASCII characters hold NULs)
_MAY_HOLD_SURROGATES = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]|\x00")


class BodyError(EdgeQAError, ValueError):
    """A body that is not JSON, or that holds a value no field may take; ``field`` names it."""

    reason = "invalid"

    def __init__(self, message: str, field: str = "body") -> None:
        super().__init__(message)
        self.field = field


class _LongInteger:
    """An integer too long to convert, standing in while its field is found."""

    def __init__(self, digits: str) -> None:
        self.digits = len(digits.lstrip("-"))


def _integer(digits: str) -> int | _LongInteger:
    try:
        return int(digits)
    except ValueError:
        return _LongInteger(digits)


def parse_body(raw: bytes) -> Any:
    """The JSON value of ``raw``; ``BodyError`` when it is not JSON, nests past Python's
    recursion limit, or holds an integer or a string that cannot be used (the module's
    docstring)."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BodyError(f"the body is not valid JSON: {error}") from None
    except RecursionError:
        raise BodyError("the body's JSON is nested too deeply") from None
    except ValueError:  # the only other one: an integer past the digit limit
        raise _long_integer(raw) from None
    if _MAY_HOLD_SURROGATES.search(raw):
        field, value = _find(body, str, _unencodable)
        if value is not None:
            raise BodyError(f"{field} is not valid Unicode: it holds a lone surrogate", field)
    return body


def _long_integer(raw: bytes) -> BodyError:
    """The error naming the field of the first integer too long to convert (parsed again, each
    integer through ``_integer``); what is wrong with the body further on, if that comes first."""
    try:
        field, value = _find(json.loads(raw, parse_int=_integer), _LongInteger)
    except RecursionError:
        return BodyError("the body's JSON is nested too deeply")
    except ValueError as error:
        return BodyError(f"the body is not valid JSON: {error}")
    if not isinstance(value, _LongInteger):
        return BodyError("the body is not valid JSON")
    message = f"{field} is an integer of {value.digits} digits, more than any field takes"
    return BodyError(message, field)


def _unencodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: the only str UTF-8 cannot encode
        return True
    return False


def _find(
    body: Any, kind: type, bad: Callable[[Any], bool] = lambda value: True
) -> tuple[str, Any]:
    """The path (``messages[0].content``; ``body`` for the whole) and value of the first value of
    ``kind`` that is ``bad``, in document order; ``("body", None)`` when there is none. A loop,
    not recursion: the body may nest nearly as deep as the recursion limit."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, kind) and bad(value):
            return path or "body", value
        if isinstance(value, dict):
            items = [(_member(path, key), item) for key, item in value.items()]
        elif isinstance(value, list):
            items = [(f"{path or 'body'}[{i}]", item) for i, item in enumerate(value)]
        else:
            continue
        stack.extend(reversed(items))
    return "body", None


def _member(path: str, key: str) -> str:
    # a key may itself hold a lone surrogate: escaped, so that the error naming it can be written
    name = key.encode("utf-8", "backslashreplace").decode("utf-8")
    return f"{path}.{name}" if path else name

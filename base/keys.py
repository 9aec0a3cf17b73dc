"""The key spec: how a question becomes the key that names its cached answer.

One definition, two languages: the JavaScript client implements the same steps and both test suites
check ``tests/vectors/keys.json``. ``docs/key-spec.md`` is the normative text.

normalize(q) = NFKC -> lower-case -> each run of whitespace becomes one space -> strip ->
strip a trailing run of ``? ! . 。 ？ ！ … ~`` together with the spaces around it.
key(q) = sha256(utf-8 of normalize(q)).hexdigest()
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

from base.errors import EdgeQAError

MAX_QUERY_CHARS = 2048

# The Unicode White_Space property, spelled out so that Python and JavaScript agree exactly
# (str.isspace() also counts U+001C..U+001F, JavaScript's \s also counts U+FEFF; neither is here).
WHITESPACE = (
    "\u0009\u000a\u000b\u000c\u000d\u0020\u0085\u00a0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
TRAILING_PUNCTUATION = "?!.\u3002\uff1f\uff01\u2026~"

_WHITESPACE_RUN = re.compile(f"[{re.escape(WHITESPACE)}]+")


# a str from JSON or JavaScript may hold unpaired UTF-16 halves; they have no UTF-8 form
_SURROGATE = re.compile("[\ud800-\udfff]")


class InvalidQueryError(EdgeQAError, ValueError):
    """A query that has no key. ``field`` names the offending input for HTTP error bodies."""

    reason = "invalid"

    def __init__(self, message: str, field: str = "q") -> None:
        super().__init__(message)
        self.field = field


class EmptyQueryError(InvalidQueryError):
    reason = "empty"


class QueryTooLongError(InvalidQueryError):
    reason = "too_long"


def normalize(query: str, max_query_chars: int = MAX_QUERY_CHARS, field: str = "q") -> str:
    """Return the normalized form of ``query`` or raise an ``InvalidQueryError``.

    Lengths count Unicode code points of the NFKC form (JavaScript: ``[...s].length``).
    """
    if not isinstance(query, str):
        raise InvalidQueryError(f"{field} must be a string, got {type(query).__name__}", field)
    if _SURROGATE.search(query):
        raise InvalidQueryError(
            f"{field} contains a lone surrogate: it is not valid Unicode", field
        )
    text = unicodedata.normalize("NFKC", query)
    if len(text) > max_query_chars:
        raise QueryTooLongError(
            f"{field} is {len(text)} characters after NFKC; the limit is {max_query_chars}", field
        )
    text = _WHITESPACE_RUN.sub(" ", text.lower()).strip(" ")
    # after the strip the text ends in a non-space, so this removes exactly a trailing
    # punctuation run and the spaces around it
    text = text.rstrip(" " + TRAILING_PUNCTUATION)
    if not text:
        raise EmptyQueryError(f"{field} is empty after normalization", field)
    return text


def key_of_normalized(normalized: str) -> str:
    """sha256 hex digest of an already normalized query."""
    return hashlib.sha256(normalized.encode("utf-8")).hexdigest()


def key(query: str, max_query_chars: int = MAX_QUERY_CHARS) -> str:
    """The cache key of ``query``: sha256 hex digest of its normalized UTF-8 bytes."""
    return key_of_normalized(normalize(query, max_query_chars))

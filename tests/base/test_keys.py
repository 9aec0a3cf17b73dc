from __future__ import annotations

import hashlib
import json
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from base.keys import (
    MAX_QUERY_CHARS,
    EmptyQueryError,
    InvalidQueryError,
    QueryTooLongError,
    key,
    normalize,
)

VECTORS = json.loads((Path(__file__).parents[1] / "vectors" / "keys.json").read_text("utf-8"))


def test_vector_file_covers_the_spec() -> None:
    names = " ".join(v["name"] for v in VECTORS["vectors"])
    assert len(VECTORS["vectors"]) >= 40
    for topic in (
        "ascii",
        "chinese",
        "full-width",
        "emoji",
        "tabs",
        "mixed whitespace",
        "trailing",
        "inner punctuation",
    ):
        assert topic in names, topic
    assert VECTORS["max_query_chars"] == MAX_QUERY_CHARS


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=lambda v: v["name"])
def test_vectors(vector: dict[str, str]) -> None:
    assert normalize(vector["input"]) == vector["normalized"]
    assert key(vector["input"]) == vector["key"]


@pytest.mark.parametrize("case", VECTORS["invalid"], ids=lambda v: v["name"])
def test_invalid_vectors(case: dict[str, str]) -> None:
    with pytest.raises(InvalidQueryError) as info:
        normalize(case["input"])
    assert info.value.reason == case["error"]


def test_errors_are_typed_and_name_the_field() -> None:
    with pytest.raises(EmptyQueryError, match="question is empty"):
        normalize(" ?! ", field="question")
    with pytest.raises(QueryTooLongError) as info:
        normalize("x" * 11, max_query_chars=10)
    assert info.value.field == "q" and "limit is 10" in str(info.value)
    assert isinstance(info.value, ValueError)
    with pytest.raises(InvalidQueryError, match="lone surrogate"):
        normalize("ok \ud83d")  # half of an emoji's UTF-16 pair
    with pytest.raises(InvalidQueryError, match="must be a string"):
        normalize(b"bytes")  # type: ignore[arg-type]


def test_limit_counts_code_points_after_nfkc() -> None:
    assert normalize("😀" * MAX_QUERY_CHARS) == "😀" * MAX_QUERY_CHARS  # 2 UTF-16 units each
    with pytest.raises(QueryTooLongError):
        normalize("\ufdfa" * 114)  # 114 chars that NFKC expands to 18 each


def test_key_is_sha256_hex_of_normalized_utf8() -> None:
    assert key("  Hello  World?? ") == hashlib.sha256(b"hello world").hexdigest()
    assert key("你好？") == hashlib.sha256("你好".encode()).hexdigest()


# --- a second, independent reading of the spec, for the property test -------------------------

_TRAILING = set("?!.。？！…~")


def _is_white_space(ch: str) -> bool:
    # Unicode White_Space = str.isspace() minus the four information separators U+001C..U+001F
    return ch.isspace() and not "\x1c" <= ch <= "\x1f"


def reference_normalize(query: str) -> str:
    try:
        query.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidQueryError("not valid Unicode") from None
    text = unicodedata.normalize("NFKC", query)
    if len(text) > MAX_QUERY_CHARS:
        raise QueryTooLongError("too long")
    out: list[str] = []
    for ch in text.lower():
        if _is_white_space(ch):
            if not out or out[-1] != " ":
                out.append(" ")
        else:
            out.append(ch)
    while out and out[0] == " ":
        out.pop(0)
    while out and (out[-1] == " " or out[-1] in _TRAILING):
        out.pop()
    if not out:
        raise EmptyQueryError("empty")
    return "".join(out)


_interesting = st.sampled_from(
    list(" \t\n\r\x0b\x0c\x1c\x1f\x85\xa0\u1680\u2003\u2028\u202f\u3000\ufeff\u200b")
    + list("?!.。？！…~,;:'\"-")
    + list("aZéÉßİΣς你好ＡＢ１😀👩🏽‍💻ﬁ²①\ufdfa")
)
_queries = st.lists(st.one_of(_interesting, st.characters()), max_size=60).map("".join)


@settings(max_examples=600, deadline=None)
@given(_queries)
def test_normalize_agrees_with_reference(query: str) -> None:
    try:
        expected = reference_normalize(query)
    except InvalidQueryError as error:
        with pytest.raises(type(error)):
            normalize(query)
        return
    assert normalize(query) == expected
    assert key(query) == hashlib.sha256(expected.encode("utf-8")).hexdigest()


@settings(max_examples=200, deadline=None)
@given(_queries)
def test_normalize_is_idempotent(query: str) -> None:
    try:
        once = normalize(query)
    except InvalidQueryError:
        return
    # clients may send an already normalized query: it must keep its key
    assert normalize(once) == once

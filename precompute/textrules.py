"""Mining's text rules (``mining.py``, rules 3-4), judged once per distinct text.

A night's logs hold each popular wording many times over; the rules read only the text, so they
run once per distinct raw text (``judge_texts``: ~60 µs a text) and the verdict is joined back to
every row in DuckDB (``logwindow.py``), where the exclusions are still counted per row. Texts
are judged a chunk at a time (``CHUNK``), so memory holds one chunk of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

from base.keys import InvalidQueryError, key_of_normalized, normalize
from base.languages import language_of
from policy.pii import find_pii
from policy.redaction import redacted_kinds
from policy.timeliness import time_sensitive

CHUNK = 5_000


def text_problem(query: str) -> tuple[str, list[str]] | None:
    """Rules 3-4 on a question's text: (reason, kinds) when it may not be published."""
    kinds = redacted_kinds(query) or find_pii(query)  # redacted when logged, or an old log
    if kinds:
        return "pii", list(kinds)
    timely = time_sensitive(query)
    if timely:
        return "time_sensitive", [timely]
    try:
        normalize(query)
    except InvalidQueryError:
        return "invalid_query", []
    return None


class Verdict(NamedTuple):
    """What the rules say of one raw text. ``language``: its profile's language; the rest only
    for texts of the language mined (else None): ``reason`` (None: usable) and its ``kinds``;
    for a usable text its ``key``, ``normalized`` form and ``form`` (whitespace runs as one
    space: what "the most common raw form" counts)."""

    query: str
    language: str
    reason: str | None
    kinds: list[str]
    key: str | None
    normalized: str | None
    form: str | None


def judge_texts(texts: Sequence[str], language: str | None = None) -> list[Verdict]:
    """The verdict on each text; ``language``: only texts of this language are judged (None:
    every text)."""
    verdicts = []
    for text in texts:
        lang = language_of(text)
        if language is not None and lang != language:
            verdicts.append(Verdict(text, lang, None, [], None, None, None))
            continue
        problem = text_problem(text)
        if problem is not None:
            verdicts.append(Verdict(text, lang, problem[0], problem[1], None, None, None))
            continue
        normalized = normalize(text)
        form = " ".join(text.split())
        verdicts.append(
            Verdict(text, lang, None, [], key_of_normalized(normalized), normalized, form)
        )
    return verdicts


def judge_all(chunks: Iterable[list[str]], language: str | None) -> Iterator[list[Verdict]]:
    """``judge_texts`` over ``chunks`` of texts, in order."""
    for chunk in chunks:
        yield judge_texts(chunk, language)

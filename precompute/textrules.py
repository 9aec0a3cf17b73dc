"""Mining's text rules (``mining.py``, rules 3-4), judged once per distinct text.

A night's logs hold each popular wording many times over; the rules read only the text, so they
run once per distinct raw text (``judge_texts``: ~60-200 µs a text) and the verdict is joined back
to every row in DuckDB (``logwindow.py``), where the exclusions are still counted per row. Texts
are judged a chunk at a time (``CHUNK``), so memory holds one chunk of them (two per process when
they are judged on several: ``judge_all``); the night's texts are handed to those processes as
row groups of a Parquet file, and their verdicts come back as files (``judge_files``). A text a
night before judged is not judged again: its
verdict comes from the cache across nights (``nightcache.py``) and only the cheap part is redone
(``rejudged``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from base.keys import InvalidQueryError, key_of_normalized, normalize
from base.languages import language_of
from policy.pii import find_pii
from policy.redaction import redacted_kinds
from policy.timeliness import time_sensitive

if TYPE_CHECKING:
    import pyarrow as pa

T = TypeVar("T")

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


# a text's language, and the reason it may not be published (None: usable) and its kinds: what
# the cache across nights keeps of a verdict (``nightcache.py``), by the text's sha256
Known = tuple[str, str | None, Sequence[str] | None]
VERDICT_COLUMNS = ("qhash", "language", "reason", "kinds")
REASONS = ("pii", "time_sensitive", "invalid_query")  # what ``text_problem`` may say


def verdict_part(schema: pa.Schema) -> bool:
    """Whether a part of the verdicts' cache has their columns' types (``VERDICT_COLUMNS``)."""
    import pyarrow as pa

    string = pa.string()
    wanted = (string, string, string, pa.list_(string))
    return all(
        schema.field(name).type == kind for name, kind in zip(VERDICT_COLUMNS, wanted, strict=True)
    )


def verdict_schema() -> pa.Schema:
    """A ``Verdict`` as an Arrow table's row."""
    import pyarrow as pa

    string = pa.string()
    return pa.schema(
        [
            ("query", string),
            ("language", string),
            ("reason", string),
            ("kinds", pa.list_(string)),
            ("key", string),
            ("normalized", string),
            ("form", string),
        ]
    )


def rejudged(text: str, known: Known, language: str | None = None) -> Verdict:
    """The verdict on ``text`` from a known one (``known``: its language, reason and kinds, as
    ``judge_texts`` gave them, kept by content hash: ``nightcache.py``): only the cheap part is
    done again, the key, normalized form and raw form of a usable text (~8 µs, where the rules
    take ~200)."""
    lang, reason, kinds = known
    if (language is not None and lang != language) or reason is not None:
        return Verdict(text, lang, reason, list(kinds or ()), None, None, None)
    normalized = normalize(text)
    return Verdict(
        text, lang, None, [], key_of_normalized(normalized), normalized, " ".join(text.split())
    )


def judge_chunk(
    texts: Sequence[str], known: Sequence[Known | None], language: str | None
) -> list[Verdict]:
    """The verdict on each text: ``rejudged`` where ``known`` holds one, else the rules."""
    fresh = iter(judge_texts([t for t, k in zip(texts, known, strict=True) if k is None], language))
    return [
        next(fresh) if k is None else rejudged(t, k, language)
        for t, k in zip(texts, known, strict=True)
    ]


def unjudged(texts: Sequence[str]) -> Iterator[tuple[Sequence[str], list[None]]]:
    """``texts`` as ``judge_all``'s chunks, none with a known verdict."""
    for start in range(0, len(texts), CHUNK):
        chunk = texts[start : start + CHUNK]
        yield chunk, [None] * len(chunk)


def judge_table(
    texts: Sequence[str], known: Sequence[Known | None], language: str | None
) -> pa.Table:
    """``judge_chunk``'s verdicts as an Arrow table (``verdict_schema``), made where they are
    judged (``judge_file`` writes it there): never a verdict at a time through the mining
    process (turning them into a table there cost it 19.8 ms a chunk)."""
    import pyarrow as pa

    verdicts = judge_chunk(texts, known, language)
    return pa.Table.from_pylist([v._asdict() for v in verdicts], schema=verdict_schema())


def judge_all(
    chunks: Iterable[tuple[Sequence[str], Sequence[Known | None]]],
    language: str | None,
    workers: int = 1,
) -> Iterator[list[Verdict]]:
    """``judge_chunk`` over ``chunks`` of (texts, known verdicts), in order; on ``workers``
    processes when more than one (started afresh: the text rules import no more than
    ``policy/`` and ``base/``), at most two chunks each in flight."""
    return _in_order(judge_chunk, chunks, language, workers)


def judge_file(todo: str, group: int, out: str, language: str | None) -> int:
    """Row group ``group`` of ``todo`` (Parquet: query, language, reason, kinds — a text and
    its cached verdict, if any) judged (``judge_table``) and written to ``out`` (Parquet of
    ``verdict_schema``): the rows written. The process that judges reads and writes the texts
    and verdicts itself: the mining process hands it a path and a number and takes a count
    back (reading each chunk, taking its verdicts back and inserting them cost its one thread
    25 ms a chunk, 25 min at a billion log rows a week)."""
    import pyarrow.parquet as pq

    table = pq.ParquetFile(todo).read_row_group(group)
    texts = table.column("query").to_pylist()
    columns = [table.column(name).to_pylist() for name in ("language", "reason", "kinds")]
    known: list[Known | None] = [
        None if lang is None else (lang, why, kinds)
        for lang, why, kinds in zip(*columns, strict=True)
    ]
    judged = judge_table(texts, known, language)
    pq.write_table(judged, out)
    return int(judged.num_rows)


def judge_files(todo: Path, out: Path, language: str | None, workers: int = 1) -> Iterator[int]:
    """``judge_file`` of every row group of ``todo``, in order, each into
    ``out/<group>.parquet``; on ``workers`` processes when more than one: the rows of each."""
    import pyarrow.parquet as pq

    groups = pq.ParquetFile(todo).metadata.num_row_groups
    calls = ((str(todo), g, str(out / f"{g:07d}.parquet"), language) for g in range(groups))
    return _ordered(judge_file, calls, workers)


def _in_order(
    judge: Callable[[Sequence[str], Sequence[Known | None], str | None], T],
    chunks: Iterable[tuple[Sequence[str], Sequence[Known | None]]],
    language: str | None,
    workers: int,
) -> Iterator[T]:
    """``judge`` of each chunk, in order, on ``workers`` processes when more than one."""
    return _ordered(judge, ((texts, known, language) for texts, known in chunks), workers)


def _ordered(fn: Callable[..., T], calls: Iterable[tuple[Any, ...]], workers: int) -> Iterator[T]:
    """``fn(*args)`` of each of ``calls``, in order, on ``workers`` processes when more than
    one (started afresh: the text rules import no more than ``policy/`` and ``base/``), at most
    two calls each in flight."""
    if workers <= 1:
        for args in calls:
            yield fn(*args)
        return
    import multiprocessing
    from concurrent.futures import Future, ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")  # never a fork of a threaded process
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        pending: deque[Future[T]] = deque()
        for args in calls:
            pending.append(pool.submit(fn, *args))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
